"""Old import path of ``testbed.servers``, kept only for bench/queue_gpu.py and bench/gen_gpu.py.

Both were running on the GPU machine when the servers moved to testbed/; delete this package once they import
``testbed.servers`` (issue 41: bench/ and tools/ import nothing from tests/).
"""

from testbed.servers import free_port as free_port
