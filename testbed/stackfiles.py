"""Stack config for tests, as the engine would hand it to the program: the stack file's plain values, and every
secret replaced by the tests' own value (marked secret), so no test needs a stack's passphrase.

Production secrets never reach tests: Pulumi.hk-prod.yaml holds no secret the repository can decrypt (its key is set
by the operators with their own passphrase), and tests put a throwaway key generated per run in its place. The dev
stack's passphrase is public ("gpuhost-dev", it protects a key generated per run), so `decrypt=True` checks that
file's encrypted value too.

Usage::

    cfg, secret_keys = stack_config("hk-prod")     # {"gpuhost:fleet": "...", "gpuhost:sshPrivateKey": "-----BEGIN..."}
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stacks.rawconfig import load_yaml

ROOT = Path(__file__).resolve().parent.parent
SECRETS = ("gpuhost:sshPrivateKey",)  # what every stack needs as a secret
DEV_PASSPHRASE = "gpuhost-dev"  # public by design: the dev stack's key is generated per run


@functools.cache
def throwaway_key() -> str:
    """A throwaway ed25519 key in OpenSSH PEM form, the same for the whole test run."""
    return (
        Ed25519PrivateKey.generate()
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        .decode()
    )


def stack_file(stack: str) -> dict:
    """The stack file's YAML; ConfigError (one line) when it nests too deep or its aliases expand too far."""
    name = f"Pulumi.{stack}.yaml"
    return load_yaml((ROOT / name).read_text(), name)


def stack_config(stack: str, decrypt: bool = False) -> tuple[dict, list[str]]:
    doc = stack_file(stack)
    config, secret = {}, []
    for k, v in (doc.get("config") or {}).items():
        if isinstance(v, dict) and set(v) == {"secure"}:
            if decrypt:
                from pulumi_crypto import PassphraseCipher

                if stack != "dev":
                    raise ValueError(f"tests never decrypt {stack}'s secrets")
                config[k] = PassphraseCipher(DEV_PASSPHRASE, salt_state=doc["encryptionsalt"]).decrypt(v["secure"])
            else:
                config[k] = throwaway_key()
            secret.append(k)
        else:
            config[k] = v if isinstance(v, str) else json.dumps(v)
    for k in SECRETS:
        if k not in config:
            config[k] = throwaway_key()
            secret.append(k)
    return config, secret
