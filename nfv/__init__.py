"""Network functions over real packet traces, on CPUs and GPUs.

``traffic`` reads and writes pcaps, keeps the flow table, reassembles TCP and
frames HTTP/1.1 messages; ``nfs`` holds the network functions, each written as
plain per-flow logic and as a batched torch kernel; ``engines`` feeds them
(CPU worker pool, GPU batcher, fixed split, FlowShader); ``run`` ties a
config, a trace and an engine into an ``nfv-report``.
"""
