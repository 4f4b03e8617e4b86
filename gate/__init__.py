"""The acceptance gate's client: what the runner (the machine running Pulumi) sends to a served model and judges.

The AcceptanceGate provider (``providers/triton_gate.py``) and the benchmarks use it; nothing here is shipped to a
serving host (``serving/`` is what runs there).

    loadgate.py       the bounded load run, percentiles and SLO check (standard library only: also piped to
                      ``python3 -`` on a guest)
    kserve.py         KServe v2 binary requests built from a model's signature, and the answer check
    health.py         health gate and warmup for a Triton endpoint
    sample_frames.py  structured synthetic camera frames as JPEG, of the sizes the gate sends
"""
