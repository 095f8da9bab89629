//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod handlers;
pub mod redis_server;

pub use redis_server::RedisServer;
pub mod redis_cluster;
pub mod stats;
