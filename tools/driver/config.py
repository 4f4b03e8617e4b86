"""Stack config as the CLI hands it to the program and providers (Pulumi.<stack>.yaml, secrets decrypted)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacks.errors import ConfigError
from stacks.rawconfig import load_yaml
from tools.driver.values import SECRET_SIG, SIG

# ---- stack config -------------------------------------------------------------------------------------------------


@dataclass
class StackConfig:
    """Namespaced config values as the engine hands them out: strings, objects as JSON strings, secrets decrypted."""

    values: dict[str, str]
    secret_keys: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path, stack: str, passphrase: str | None, project: str = "gpuhost") -> StackConfig:
        name = f"Pulumi.{stack}.yaml"
        try:  # the loader's own checks: nesting and alias bombs refused before the YAML is built
            doc = load_yaml((root / name).read_text(), name) or {}
        except ConfigError as e:
            raise SystemExit("\n".join(e.lines)) from None
        cipher = None
        values, secret = {}, []
        for k, v in (doc.get("config") or {}).items():
            key = k if ":" in k else f"{project}:{k}"
            if isinstance(v, dict) and set(v) == {"secure"}:
                if cipher is None:
                    if passphrase is None:
                        raise SystemExit(f"stack {stack} has secrets: set PULUMI_CONFIG_PASSPHRASE")
                    from pulumi_crypto import PassphraseCipher

                    cipher = PassphraseCipher(passphrase, salt_state=doc["encryptionsalt"])
                values[key] = cipher.decrypt(v["secure"])
                secret.append(key)
            else:
                values[key] = v if isinstance(v, str) else json.dumps(v)
        return cls(values, secret)

    def with_values(self, **updates: Any) -> StackConfig:
        """A copy with some keys replaced (`fleet=...` objects are JSON-encoded); for tests and `gpuhost.sh up`."""
        v = dict(self.values)
        for k, x in updates.items():
            key = k if ":" in k else f"gpuhost:{k}"
            v[key] = x if isinstance(x, str) else json.dumps(x)
        return StackConfig(v, list(self.secret_keys))

    def configure_args(self) -> dict:
        # Secrets go out marked secret; the dynamic provider's Configure unwraps them (dynamic/__main__.py).
        return {k: ({SIG: SECRET_SIG, "value": v} if k in self.secret_keys else v) for k, v in self.values.items()}

    def sealed(self, passphrase: str, cipher: Any = None) -> dict:
        """For the state file: secrets encrypted with the stack passphrase, never in plaintext."""
        from pulumi_crypto import PassphraseCipher

        c = cipher or PassphraseCipher(passphrase)
        return {
            "encryptionsalt": c.salt_state,
            "values": {k: ({"secure": c.encrypt(v)} if k in self.secret_keys else v) for k, v in self.values.items()},
        }

    @classmethod
    def unseal(cls, doc: dict, passphrase: str) -> StackConfig:
        from pulumi_crypto import PassphraseCipher

        c = PassphraseCipher(passphrase, salt_state=doc["encryptionsalt"])
        values, secret = {}, []
        for k, v in doc["values"].items():
            if isinstance(v, dict):
                values[k] = c.decrypt(v["secure"])
                secret.append(k)
            else:
                values[k] = v
        return cls(values, secret)
