"""plans.vfio: VfioBinding rebuilds the initramfs only when a driver inside it would claim a device first (table)."""

from __future__ import annotations

import pytest

from plans.vfio import Image, claims_script, parse_claimers, parse_initramfs, plan_initramfs, plan_initramfs_restore

CMD = "update-initramfs -u -k all >/dev/null 2>&1"
GPU, AUDIO = "0000:81:00.0", "0000:81:00.1"
OURS = {"gpuhost-vfio.conf", "gpuhost-blacklist-nouveau.conf"}

# What the provider's read prints: a Debian host whose initramfs (MODULES=most + plymouth) carries nouveau, and
# a second, older kernel's image that cannot be listed.
CAPTURE = """\
@@end
@@initramfs
@image /boot/initrd.img-6.1.0-27-amd64
usr/lib/modules/6.1.0-27-amd64/kernel/drivers/gpu/drm/nouveau/nouveau.ko
usr/lib/modules/6.1.0-27-amd64/kernel/drivers/nvme/host/nvme.ko.xz
usr/lib/modules/6.1.0-27-amd64/kernel/sound/pci/hda/snd-hda-intel.ko
etc/modprobe.d/gpuhost-vfio.conf
@image /boot/initrd.img-6.1.0-26-amd64 unlisted
@@vfio-claimers
0000:81:00.0 nouveau nvidiafb vfio_pci
0000:81:00.1 snd_hda_intel snd_hda_intel
@@vfio-end
"""

DRACUT = """\
@@initramfs
@image /boot/initramfs-5.14.0-427.el9.x86_64.img
-rw-r--r--   1 root     root        20480 Jan  1 00:00 usr/lib/modules/5.14.0-427.el9.x86_64/kernel/drivers/gpu/drm/nouveau/nouveau.ko.xz
-rw-r--r--   1 root     root          120 Jan  1 00:00 etc/modprobe.d/gpuhost-blacklist-nouveau.conf
@@vfio-claimers
"""


def test_parse_initramfs_listing_and_claimers():
    images = parse_initramfs(CAPTURE)
    assert [i.path for i in images] == ["/boot/initrd.img-6.1.0-27-amd64", "/boot/initrd.img-6.1.0-26-amd64"]
    assert images[0].modules == {"nouveau", "nvme", "snd_hda_intel"} and images[0].ours == {"gpuhost-vfio.conf"}
    assert images[1].listed is False and not images[1].modules
    assert parse_claimers(CAPTURE) == {GPU: {"nouveau", "nvidiafb", "vfio_pci"}, AUDIO: {"snd_hda_intel"}}
    (d,) = parse_initramfs(DRACUT)  # lsinitrd prints ls -l lines: the path is the last field
    assert d.modules == {"nouveau"} and d.ours == {"gpuhost-blacklist-nouveau.conf"}
    assert parse_initramfs("@@initramfs\n@@vfio-claimers\n") == [] and parse_claimers("") == {}


def test_claims_script_quotes_the_slot_and_prints_both_sections():
    text = claims_script(["0000:81:00", "x'; rm -rf /"])
    assert "@@initramfs" in text and "@@vfio-claimers" in text and text.rstrip().endswith("echo @@vfio-end")
    assert "/sys/bus/pci/devices/0000:81:00.*" in text
    assert "'/sys/bus/pci/devices/x'\"'\"'; rm -rf /'.*" in text  # a hostile value stays one quoted word


def img(path="/boot/initrd.img-6.1.0-27-amd64", mods=(), ours=(), listed=True) -> Image:
    return Image(path, listed, frozenset(mods), frozenset(ours))


DEBIAN_DEP = img(mods={"virtio_blk", "ext4", "crc32c_generic"})  # MODULES=dep: what the root disk needs
DEBIAN_NOUVEAU = img(mods={"virtio_blk", "nouveau", "drm"})
BAKED = img(mods={"virtio_blk", "nouveau"}, ours=OURS)
BAKED_NO_DRIVER = img(mods={"virtio_blk"}, ours={"gpuhost-vfio.conf"})
UNLISTED = img(listed=False)
NVIDIA = {GPU: {"nouveau", "nvidiafb"}, AUDIO: {"snd_hda_intel"}}
BOCHS = {GPU: {"bochs"}, AUDIO: {"snd_hda_intel"}}


@pytest.mark.parametrize(
    "images, claimers, blacklisted, changed, rebuild, words",
    [
        # the emulated server: bochs/snd_hda_intel are not in a MODULES=dep initramfs
        ([DEBIAN_DEP], BOCHS, ["nouveau"], True, False, "not in any initramfs"),
        # a stock NVIDIA host with nouveau in the initramfs: vfio's config must be baked in
        ([DEBIAN_NOUVEAU], NVIDIA, ["nouveau"], True, True, "nouveau is in /boot/initrd.img-6.1.0-27-amd64"),
        # the same, re-run after a dropped connection (files already written, image never rebuilt)
        ([DEBIAN_NOUVEAU], NVIDIA, ["nouveau"], False, True, "would claim the device before vfio-pci"),
        # converged: the image already carries both files
        ([BAKED], NVIDIA, ["nouveau"], False, False, "already carries"),
        # the config changes: the baked copy is stale
        ([BAKED], NVIDIA, ["nouveau"], True, True, "would claim"),
        # nouveau is only blacklisted (no claimer found): it is still a module that loads early
        ([DEBIAN_NOUVEAU], {GPU: set()}, ["nouveau"], True, True, "nouveau is in"),
        # not blacklisted and not a claimer of these devices: irrelevant
        ([DEBIAN_NOUVEAU], BOCHS, [], True, False, "no initramfs rebuild"),
        # the audio function's driver in the initramfs counts too
        ([img(mods={"snd_hda_intel"})], BOCHS, [], True, True, "snd_hda_intel is in"),
        # vfio-pci itself in the initramfs is no reason
        ([img(mods={"vfio_pci", "vfio"})], {GPU: {"vfio_pci"}}, [], True, False, "no initramfs rebuild"),
        # a gpuhost config baked earlier (an older version always rebuilt) goes stale when the files change
        ([BAKED_NO_DRIVER], BOCHS, [], True, True, "older copy"),
        ([BAKED_NO_DRIVER], BOCHS, [], False, False, "no initramfs rebuild"),
        # an image that cannot be listed: rebuild when the config changes, to be safe
        ([DEBIAN_DEP, UNLISTED], BOCHS, [], True, True, "cannot list"),
        ([DEBIAN_DEP, UNLISTED], BOCHS, [], False, False, "no initramfs rebuild"),
        # no initramfs at all
        ([], NVIDIA, ["nouveau"], True, False, "no initramfs image"),
    ],
)
def test_plan_initramfs(images, claimers, blacklisted, changed, rebuild, words):
    wanted = {"gpuhost-vfio.conf"} | ({"gpuhost-blacklist-nouveau.conf"} if blacklisted else set())
    d = plan_initramfs(images, claimers, blacklisted, wanted, changed, CMD)
    assert (not d.plan.noop) is rebuild, d.plan.sentences
    assert [a.command for a in d.plan.actions] == ([CMD] if rebuild else [])
    assert words in d.plan.sentences[0]


@pytest.mark.parametrize(
    "images, rebuild",
    [
        ([DEBIAN_DEP], False),  # never baked in: the image is as found
        ([DEBIAN_NOUVEAU], False),  # a claimer inside, but gpuhost's config was never baked in
        ([BAKED], True),
        ([DEBIAN_DEP, BAKED_NO_DRIVER], True),
        ([UNLISTED], True),
        ([], False),
    ],
)
def test_plan_initramfs_restore(images, rebuild):
    p = plan_initramfs_restore(images, CMD)
    assert (not p.noop) is rebuild and [a.command for a in p.actions] == ([CMD] if rebuild else [])
