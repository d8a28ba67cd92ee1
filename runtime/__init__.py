"""The runtime: execute a plan with torch.distributed and measure it (``dl-nfv train``)."""
