//! `serve --metrics-listen ADDR`: the Prometheus text exposition (OpenMetrics) of the shards'
//! metrics (`shards::metrics`), served at `/metrics` from threads of its own, never a shard's
//! (issue 10 section 1).
//!
//! - [`encode`]: one scrape (the shards' snapshots plus process figures) as text.
//! - [`scrape`]: gathering one scrape, logging shards that did not answer.
//! - [`http`]: the listener (bounded connections, a deadline per connection).

pub mod encode;
pub mod http;
pub mod scrape;

pub use encode::{CONTENT_TYPE, ProcessFigures, Scrape, encode};
pub use http::{BoundListener, ListenError, ListenerLimits, MetricsListener, Scraper};
pub use scrape::ScrapeSource;
