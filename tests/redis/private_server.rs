//! The test harness itself: a private redis-server comes up and goes away.
use crate::common;

use common::RedisServer;

#[tokio::test]
async fn private_redis_server_starts_and_stops() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 6379, "must never use the shared server");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    let port = server.port();
    server.stop();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}
