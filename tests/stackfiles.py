"""Read a Pulumi.<stack>.yaml as the engine would hand it to the program: plain values, and secrets decrypted with
the stack's passphrase and marked secret. Uses the pulumi-crypto library (Pulumi's passphrase format)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pulumi_crypto import PassphraseCipher

ROOT = Path(__file__).resolve().parent.parent
PASSPHRASES = {"dev": "gpuhost-dev", "hk-prod": "gpuhost-hk-prod-example"}


def stack_config(stack: str) -> tuple[dict, list[str]]:
    doc = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    cipher = PassphraseCipher(PASSPHRASES[stack], salt_state=doc["encryptionsalt"])
    config, secret = {}, []
    for k, v in doc["config"].items():
        if isinstance(v, dict) and set(v) == {"secure"}:
            config[k] = cipher.decrypt(v["secure"])
            secret.append(k)
        else:
            config[k] = v if isinstance(v, str) else json.dumps(v)
    return config, secret
