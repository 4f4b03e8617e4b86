"""Old import path of ``testbed.servers.redis`` for bench/queue_gpu.py only (see ``tests/servers/__init__.py``)."""

from testbed.servers.redis import wait_ping as wait_ping
