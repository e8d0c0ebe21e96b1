"""What every part of the pipeline stands on, importing nothing outside core/: errors, typed
configs and what counts as the same run, storage (atomic writes, manifests), data sources and
downloads, the HTTP client, precision, shards, the trajectory text format, a child's output relay
and GPU memory checks."""
