"""Old import path of ``testbed.servers.gateway`` for bench/queue_gpu.py and bench/gen_gpu.py only (see
``tests/servers/__init__.py``)."""

from testbed.servers.gateway import spawn_worker as spawn_worker
