"""A text-to-image generator of SDXL's shape and cost, with random weights (seed 001's workload, issue 42 §1).

The parts and what each costs as in SDXL 1024×1024:

* the UNet: ``diffusers``' ``UNet2DConditionModel`` built from SDXL base 1.0's own config (``SDXL_UNET``, 2.6 B
  parameters; cross-attention over 2048-d text tokens, ``text_time`` added conditioning: pooled text embeds and
  the six size/crop time ids), run ``steps`` times on a batch of 2 per image (classifier-free guidance: the empty
  prompt and the prompt);
* the VAE: ``diffusers``' ``AutoencoderKL`` from SDXL's VAE config (``SDXL_VAE``), its decoder once per image;
* the scheduler: ``EulerDiscreteScheduler`` from SDXL's scheduler config (``SDXL_SCHEDULER``);
* the text encoder: a hashed-token embedding (``HashedText``: each word's hash picks a row of a random table, 77
  tokens of 2048 dims, a pooled vector of 1280), standing in for SDXL's CLIP ViT-L and OpenCLIP bigG (together
  about 1 % of an image's time beside 60 UNet passes).

Random weights do not change the cost: the same layers, shapes and dtypes run the same kernels whatever the values
(only data-dependent work would differ, and none of these layers has any). They do change the pictures: they are
not images of the prompt, but they are a deterministic function of (prompt, seed), so an answer can be checked
against its own reference. The weights come from ``torch.manual_seed(weights_seed)`` on the model's device, so
every instance and backend on one kind of device holds the same ones.

``TINY_UNET``/``TINY_VAE`` are the same classes at a few channels, for CPU tests (64×64, 1–2 steps).

Usage::

    gen = Generator.build("tiny", torch.device("cpu"), torch.float32, height=64, width=64)
    images = gen([b"a lighthouse at dawn", b"a red fox"], [1, 2], steps=2)    # uint8 [2, 64, 64, 3]
    png = png_bytes(images[0])
"""

from __future__ import annotations

import copy
import hashlib
import io
import re
from typing import Any, Sequence

import torch
from torch import nn

# stabilityai/stable-diffusion-xl-base-1.0, unet/config.json (the Hugging Face Hub repository; diffusers 0.19's
# keys, the ones left at their defaults omitted). 2,567,463,684 parameters.
SDXL_UNET: dict[str, Any] = {
    "act_fn": "silu",
    "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20],
    "block_out_channels": [320, 640, 1280],
    "center_input_sample": False,
    "class_embed_type": None,
    "conv_in_kernel": 3,
    "conv_out_kernel": 3,
    "cross_attention_dim": 2048,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": False,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "only_cross_attention": False,
    "out_channels": 4,
    "projection_class_embeddings_input_dim": 2816,
    "resnet_time_scale_shift": "default",
    "sample_size": 128,
    "time_embedding_type": "positional",
    "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "upcast_attention": None,
    "use_linear_projection": True,
}

# stabilityai/stable-diffusion-xl-base-1.0, vae/config.json. Real SDXL weights overflow FP16 in the decoder
# (``force_upcast``); random ones do not, and an FP32 decoder would cost more than the one served in FP16 with the
# fixed weights (madebyollin/sdxl-vae-fp16-fix) that deployments use.
SDXL_VAE: dict[str, Any] = {
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}

# stabilityai/stable-diffusion-xl-base-1.0, scheduler/scheduler_config.json.
SDXL_SCHEDULER: dict[str, Any] = {
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "use_karras_sigmas": False,
}

# The same classes at a few channels (CPU tests): 16-d text, 8-d time ids (16 + 6 x 8 = 64 added-cond inputs).
TINY_UNET: dict[str, Any] = {
    **SDXL_UNET,
    "addition_embed_type_num_heads": 2,
    "addition_time_embed_dim": 8,
    "attention_head_dim": [2, 4],
    "block_out_channels": [16, 32],
    "cross_attention_dim": 16,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "projection_class_embeddings_input_dim": 64,
    "sample_size": 8,
    "transformer_layers_per_block": [1, 1],
    "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
}
TINY_VAE: dict[str, Any] = {
    **SDXL_VAE,
    "block_out_channels": [8, 8, 16, 16],
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "sample_size": 64,
}

SIZES = {"sdxl": (SDXL_UNET, SDXL_VAE, 1280), "tiny": (TINY_UNET, TINY_VAE, 16)}
TOKENS = 77  # CLIP's context length
VOCAB = 49408  # CLIP's vocabulary size
# The time ids' (original size, crop top-left, target size) and the pooled text embeds feed SDXL's added embedding.
TIME_IDS = 6


def words(prompt: str) -> list[str]:
    """The prompt's tokens as the hashed encoder sees them: lowercased words and punctuation marks.

    >>> words("A red Fox, at dawn!")
    ['a', 'red', 'fox', ',', 'at', 'dawn', '!']
    """
    return re.findall(r"\w+|[^\w\s]", prompt.lower())


def token_ids(prompt: str, length: int = TOKENS) -> list[int]:
    """``length`` ids: begin (0), each word's hash into the vocabulary (at most ``length`` - 2 words), end (1), then
    padding (2), as CLIP's tokenizer lays out a prompt.

    >>> token_ids("", 4)
    [0, 1, 2, 2]
    """
    ids = [
        3 + int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "little") % (VOCAB - 3)
        for w in words(prompt)
    ]
    ids = [0, *ids[: length - 2], 1]
    return ids + [2] * (length - len(ids))


class HashedText(nn.Module):
    """Prompt → (token states [B, 77, dim], pooled [B, pooled_dim]): a random embedding table indexed by word hashes
    plus positions, one linear layer for the pooled vector (mean over the prompt's tokens)."""

    def __init__(self, dim: int, pooled_dim: int):
        super().__init__()
        self.table = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.randn(TOKENS, dim) * 0.02)
        self.pool = nn.Linear(dim, pooled_dim)

    def forward(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([token_ids(p) for p in prompts], device=self.position.device)
        states = self.table(ids) + self.position
        used = (ids != 2).unsqueeze(-1).to(states.dtype)
        pooled = self.pool((states * used).sum(1) / used.sum(1))
        return states, pooled


class Generator:
    """The UNet, the VAE decoder, the text encoder and the scheduler of one size, on one device and dtype."""

    def __init__(self, unet: Any, vae: Any, text: HashedText, scheduler: Any, height: int, width: int):
        self.unet, self.vae, self.text, self.scheduler = unet, vae, text, scheduler
        self.height, self.width = height, width
        self.device, self.dtype = unet.device, unet.dtype

    @classmethod
    def build(
        cls, size: str, device: torch.device, dtype: torch.dtype, *, height: int, width: int, weights_seed: int = 0
    ) -> "Generator":
        """Random weights from ``weights_seed``, made on ``device`` (an SDXL UNet initialised on a CPU takes
        minutes; on the GPU, seconds), then cast to ``dtype``."""
        from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel

        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
        if height % 8 or width % 8:
            raise ValueError(f"height and width must be multiples of 8 (the VAE's factor), got {height}x{width}")
        unet_cfg, vae_cfg, pooled = SIZES[size]
        torch.manual_seed(weights_seed)
        with torch.device(device):
            unet = UNet2DConditionModel.from_config(unet_cfg)
            vae = AutoencoderKL.from_config(vae_cfg)
            text = HashedText(unet_cfg["cross_attention_dim"], pooled)
        for m in (unet, vae, text):
            m.to(device, dtype).eval().requires_grad_(False)
        vae.encoder = None  # text-to-image decodes only
        scheduler = EulerDiscreteScheduler.from_config(SDXL_SCHEDULER)
        return cls(unet, vae, text, scheduler, height, width)

    def noise(self, seeds: Sequence[int]) -> torch.Tensor:
        """Each image's starting latents from its own seed (drawn on the CPU: the same on any device)."""
        shape = (self.unet.config.in_channels, self.height // 8, self.width // 8)
        rows = [torch.randn(shape, generator=torch.Generator().manual_seed(int(s))) for s in seeds]
        return torch.stack(rows).to(self.device, self.dtype)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], seeds: Sequence[int], *, steps: int, guidance: float) -> torch.Tensor:
        """uint8 images [B, H, W, 3] on the device, one per (prompt, seed). Raises ValueError when the decoded
        pixels are not finite (served as that batch's error, never as a black picture)."""
        n = len(prompts)
        scheduler = copy.deepcopy(self.scheduler)  # its step index is state: one per call
        scheduler.set_timesteps(steps, device=self.device)
        states, pooled = self.text(["", *prompts])
        uncond, cond = states[:1].expand(n, -1, -1), states[1:]
        context = torch.cat([uncond, cond])
        text_embeds = torch.cat([pooled[:1].expand(n, -1), pooled[1:]])
        ids = [self.height, self.width, 0, 0, self.height, self.width]
        time_ids = torch.tensor([ids] * (2 * n), device=self.device, dtype=self.dtype)
        added = {"text_embeds": text_embeds, "time_ids": time_ids}
        latents = self.noise(seeds) * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            x = scheduler.scale_model_input(torch.cat([latents, latents]), t)
            eps = self.unet(x, t, encoder_hidden_states=context, added_cond_kwargs=added).sample
            eps_uncond, eps_cond = eps.chunk(2)
            latents = scheduler.step(eps_uncond + guidance * (eps_cond - eps_uncond), t, latents).prev_sample
        image = self.vae.decode(latents.to(self.dtype) / self.vae.config.scaling_factor).sample
        if not bool(torch.isfinite(image).all()):
            raise ValueError("the decoded image is not finite (NaN or inf in the generator's output)")
        pixels = ((image.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return pixels.permute(0, 2, 3, 1).contiguous()


def png_bytes(pixels: Any, level: int = 1) -> bytes:
    """An RGB uint8 [H, W, 3] image (numpy or a CPU tensor) as PNG (zlib ``level``: 1 is fast, the bytes are
    still lossless). A PNG ends with its IEND chunk's CRC (AE 42 60 82), never with a zero byte: a row of such
    bytes zero-padded in a batch is read back exactly (``serving.bytes_rows``)."""
    from PIL import Image

    array = pixels.numpy() if isinstance(pixels, torch.Tensor) else pixels
    out = io.BytesIO()
    Image.fromarray(array, "RGB").save(out, format="PNG", compress_level=level)
    return out.getvalue()
