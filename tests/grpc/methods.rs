//! Who a call is (metadata, the peer) and which of its methods it calls:
//! per-method policies, in code and in a policy file.

use std::sync::Arc;

use fleetgate::RateLimitLayer;
use fleetgate::key::{HeaderKey, PeerIp};
use fleetgate::rate_limit::RoutePolicies;
use fleetgate::spec::PolicyFile;
use tonic::Code;
use tower::ServiceExt;

use crate::{Greeter, GreeterClient, channel, hello, on_both_stores, serve};

on_both_stores!(keys_from_metadata_hashed_else_the_peer, store => {
    let layer = RateLimitLayer::new(store.limiter("per-key", "1/min"))
        .key(HeaderKey::new("x-api-key").or(PeerIp))
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    client.say_hello(hello("a", Some("secret-a"))).await.expect("key a");
    let refused = client.say_hello(hello("a", Some("secret-a"))).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    client.say_hello(hello("b", Some("secret-b"))).await.expect("key b: its own budget");
    // No key: the peer's address (tonic's TcpConnectInfo), its own budget.
    client.say_hello(hello("c", None)).await.expect("the peer");
    let refused = client.say_hello(hello("c", None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(greeter.calls(), 3);

    // The API keys were hashed before they became keys.
    if let Some(server) = &store.server {
        let mut admin = server.admin().await;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut admin).await.unwrap();
        assert!(!keys.is_empty());
        assert!(keys.iter().all(|k| !k.contains("secret")), "{keys:?}");
        // The peer's key is its address, which Redis sees only hashed.
        let namer = crate::common::redis_store(server).await;
        let peer = fleetgate::Key::from_ip(std::net::Ipv4Addr::LOCALHOST.into());
        let peer_key = namer.gcra_key(&store.limiter("per-key", "1/min").policy(), &peer, 0);
        assert!(keys.contains(&peer_key), "the peer's key {peer_key}: {keys:?}");
        assert!(keys.iter().all(|k| !k.contains("127.0.0.1")), "{keys:?}");
    }
});

on_both_stores!(keys_from_bearer_tokens_hashed, store => {
    let layer = RateLimitLayer::new(store.limiter("per-token", "1/min"))
        .key(HeaderKey::bearer())
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);
    let call = |authorization: &str| {
        let mut call = hello("a", None);
        call.metadata_mut()
            .insert("authorization", authorization.parse().expect("ASCII metadata"));
        call
    };

    client.say_hello(call("Bearer secret-a")).await.expect("token a");
    let refused = client.say_hello(call("Bearer secret-a")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    client.say_hello(call("Bearer secret-b")).await.expect("token b: its own budget");
    // Another scheme is no key: refused as a call without one.
    let refused = client.say_hello(call("Basic c2VjcmV0")).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(greeter.calls(), 2);

    // The tokens were hashed before they became keys.
    if let Some(server) = &store.server {
        let mut admin = server.admin().await;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut admin).await.unwrap();
        assert_eq!(keys.len(), 2, "one key per token: {keys:?}");
        assert!(keys.iter().all(|k| !k.contains("secret")), "{keys:?}");
    }
});

/// Three calls of `SayHello` pass per minute, one of every other method of
/// the service, and nothing else is limited.
async fn per_method(routes: RoutePolicies) {
    let layer = RateLimitLayer::per_route(routes)
        .unwrap()
        .key(PeerIp)
        .grpc();
    let (greeter, _dropped) = Greeter::new();
    let addr = serve!(layer, greeter.clone());
    let mut client = GreeterClient::new(channel(addr).await);

    for _ in 0..3 {
        client
            .say_hello(hello("a", None))
            .await
            .expect("SayHello's budget");
    }
    let refused = client.say_hello(hello("a", None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("policy hello"),
        "{}",
        refused.message()
    );

    let stream = client
        .say_hello_stream(hello("a", None))
        .await
        .expect("its own budget");
    drop(stream);
    let refused = client.say_hello_stream(hello("a", None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("policy greeter"),
        "{}",
        refused.message()
    );

    // A method no rule matches passes unlimited, to the server's own
    // answer (it has no such service: UNIMPLEMENTED).
    let channel = channel(addr).await;
    for _ in 0..5 {
        let call = crate::refusals::raw_call_to("/fleetgate.demo.Other/SayHello");
        let answer = channel.clone().oneshot(call).await.expect("an answer");
        assert_eq!(
            answer.headers()["grpc-status"],
            "12",
            "{:?}",
            answer.headers()
        );
    }
}

on_both_stores!(per_method_policies_in_code, store => {
    let routes = RoutePolicies::new()
        .route(None, "/fleetgate.demo.Greeter/SayHello", store.limiter("hello", "3/min"))
        .unwrap()
        .route(None, "/fleetgate.demo.Greeter/*", store.limiter("greeter", "1/min"))
        .unwrap();
    per_method(routes).await;
});

on_both_stores!(per_method_policies_in_a_policy_file, store => {
    let file: PolicyFile = toml::from_str(
        r#"
        [policies]
        hello = "3/min"
        greeter = "1/min"

        [[routes]]
        path = "/fleetgate.demo.Greeter/SayHello"
        policy = "hello"

        [[routes]]
        path = "/fleetgate.demo.Greeter/*"
        method = "POST"
        policy = "greeter"
        "#,
    )
    .unwrap();
    per_method(RoutePolicies::from_file(&file, Arc::clone(&store.store)).unwrap()).await;
});
