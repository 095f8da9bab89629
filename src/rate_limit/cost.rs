//! What a request costs.

/// How much of the limit a request uses. A plain `u64` is a fixed cost; a
/// closure `Fn(&Req) -> u64` weighs each request.
///
/// A cost above the policy's smallest burst can never pass: such requests
/// are refused without a store round trip and without `Retry-After`.
pub trait Cost<Req>: Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &Req) -> u64;
}

impl<Req> Cost<Req> for u64 {
    fn cost(&self, _req: &Req) -> u64 {
        *self
    }
}

impl<Req, F> Cost<Req> for F
where
    F: Fn(&Req) -> u64 + Send + Sync + 'static,
{
    fn cost(&self, req: &Req) -> u64 {
        self(req)
    }
}
