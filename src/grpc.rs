//! gRPC: the layers around tonic servers and clients.
#![doc = include_str!("../docs/grpc.md")]
