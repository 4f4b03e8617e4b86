"""Code that serves models, and where each module runs.

Runs on the serving hosts (installed there by the components; each keeps to what its host has):
    front.py            the queue's HTTP entry (KServe v2 JSON in, the job's result out), one per gateway
    worker.py           a queue worker: jobs from the Redis Stream to the backend the scheduler picks
    queue.py            seed 001's request queue on Redis Streams (submit with backpressure, exactly-once results)
    scheduler.py        pure: which backend gets the next job (weights, load, health, queue time)
    metrics.py          the Prometheus text format the queue workers expose
    microbatch.py       client micro-batching: items within a short window into one request (seed 004)
    adaptive_window.py  the adaptive batching-window controller beside Triton (seed 004), its /metrics
    bytes_rows.py       KServe BYTES carried inside as UINT8 rows (the front, the workers, the python backend)
    standin_model.py    Triton python-backend stand-in keeping a real model's signature
    yolov8n_model.py    Triton python-backend model: YOLOv8n on the GPU
    sdxl_generator_model.py  Triton python-backend model: seed 001's text-to-image generator at SDXL's shape
    models/             the model code shipped into Triton repositories (YOLOv8n, its weights loader, the generator)

The acceptance gate's client, which runs on the runner (the machine running Pulumi), is ``gate/``.
"""
