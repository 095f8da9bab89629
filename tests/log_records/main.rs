//! The decision span through tracing's `log` fallback, and what the log
//! says when a router is served without connect info. A binary of its own:
//! it installs the process's logger, and a tracing subscriber installed
//! anywhere in the process would turn the fallback off.
mod log_records;
