//! `serve --metrics-listen ADDR`: the Prometheus text exposition of the shards' metrics
//! (`shards::metrics`), served at `/metrics` from its own thread, never a shard's (issue 10
//! section 1).
