"""One cold `read_host_facts` in a fresh process (as a CLI or a fresh provider process would pay it).

python -m bench.gpuhost_facts '<HostSpec json>' <private key file>   # prints {"wall_s", "roundtrips", ...}
"""

import json
import sys
import time

t0 = time.monotonic()

from access import keys, ssh  # noqa: E402
from facts.host import read_host_facts  # noqa: E402


def main() -> None:
    spec = ssh.HostSpec.model_validate_json(sys.argv[1])
    keys.set_private_key(spec.key_name, open(sys.argv[2]).read())
    f = read_host_facts(ssh.connect(spec))
    print(
        json.dumps(
            {
                "wall_s": time.monotonic() - t0,
                "roundtrips": ssh.ROUNDTRIPS.total,
                "pci_devices": len(f.pci),
                "cpus": len(f.cpus),
            }
        )
    )


if __name__ == "__main__":
    main()
