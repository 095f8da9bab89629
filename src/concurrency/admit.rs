//! The response future of layers that admit a request by taking a store
//! lease (this limiter, the fleet load shedder): wait for the
//! lease, call the inner service holding it, or refuse; and turn that into
//! an HTTP response whose body holds the lease, or a typed error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::adaptive::{AdaptiveCall, Verdict};
use super::{Acquire, Admission, ConcurrencyBody};
use crate::error::BoxError;
use crate::error::StoreError;
use crate::key::Key;
use crate::lease::{LeaseGuard, StoreLease};
use crate::response::{Answer, Outcome};

/// A layer that admits requests with store leases.
pub(crate) trait Gate: Answer {
    /// What to do with the store's answer: pass (holding the lease, if one
    /// was taken) or refuse. Counts and traces the decision; `latency` is
    /// the store's, when it did I/O; `key` the request's identity, when
    /// the gate has one.
    fn admit(
        &self,
        result: Result<Admission, StoreError>,
        latency: Option<Duration>,
        key: Option<&Key>,
    ) -> Result<Option<LeaseGuard<StoreLease>>, Self::Refusal>;

    /// The refusal for a failure outside the store's decision (the future
    /// polled after completion): answered, never panicked on.
    fn broken(&self, err: StoreError) -> Self::Refusal;

    /// Before [`admit`](Self::admit): a store failure may be decided by a
    /// local fallback instead ([`FailurePolicy::Local`](crate::FailurePolicy::Local)),
    /// whose settings then answer the request (`gate` is replaced by
    /// them). `key` is the request's identity, when the gate needs one.
    fn fall_back(
        gate: &mut Arc<Self>,
        result: Result<Admission, StoreError>,
        key: Option<&Key>,
    ) -> Result<Admission, StoreError>
    where
        Self: Sized;

    /// Starts measuring an admitted call, for a gate whose limit adapts.
    fn measure(&self) -> Option<AdaptiveCall> {
        None
    }

    /// A measured call was answered.
    fn measured(&self, call: AdaptiveCall, verdict: Verdict) {
        let _ = (call, verdict);
    }
}

pin_project! {
    /// Waits for the lease, then calls the inner service holding it, or
    /// refuses. Dropped at any point (the client went away, a timeout
    /// outside, a panic unwinding through the handler), it releases the
    /// lease it holds or may have taken.
    pub(crate) struct Admitting<S, Req, G>
    where
        S: Service<Req>,
        G: Gate,
    {
        #[pin]
        state: State<S, Req, G::Refusal>,
        gate: Arc<G>,
        // An admitted call being measured for an adaptive limit; dropped
        // unanswered (cancelled), it is no sample.
        measuring: Option<AdaptiveCall>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F>
    where
        S: Service<Req>,
    {
        Acquiring {
            acquire: Acquire,
            inner: Option<S>,
            req: Option<Req>,
            // The request's identity, when the gate has one.
            key: Option<Key>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            guard: Option<LeaseGuard<StoreLease>>,
        },
        Rejected {
            refusal: Option<F>,
        },
        Done,
    }
}

impl<S: Service<Req>, Req, G: Gate> Admitting<S, Req, G> {
    /// Starts a request on `inner` (ready) once `acquire` has an answer.
    /// When the store has decided already (the memory store), the ready
    /// service is called at once; when it does I/O, the ready service moves
    /// into the future and a clone takes its place. `key` is kept for the
    /// gate, if it has one (to count its refusals, and for a local
    /// fallback).
    pub(crate) fn start(
        mut gate: Arc<G>,
        mut acquire: Acquire,
        inner: &mut S,
        req: Req,
        key: Option<Key>,
    ) -> Self
    where
        S: Clone,
    {
        if let Some(result) = acquire.take_ready() {
            let result = G::fall_back(&mut gate, result, key.as_ref());
            return match gate.admit(result, None, key.as_ref()) {
                Ok(guard) => {
                    let measuring = guard.as_ref().and_then(|_| gate.measure());
                    let mut admitting = Self::calling(gate, inner.call(req), guard);
                    admitting.measuring = measuring;
                    admitting
                }
                Err(refusal) => Self::rejected(gate, refusal),
            };
        }
        let clone = inner.clone();
        let inner = std::mem::replace(inner, clone);
        Self::with_state(
            gate,
            State::Acquiring {
                acquire,
                inner: Some(inner),
                req: Some(req),
                key,
            },
        )
    }

    /// Already calling the inner service, holding `guard` (if any).
    pub(crate) fn calling(
        gate: Arc<G>,
        fut: S::Future,
        guard: Option<LeaseGuard<StoreLease>>,
    ) -> Self {
        Self::with_state(gate, State::Calling { fut, guard })
    }

    /// Refused before the store was asked.
    pub(crate) fn rejected(gate: Arc<G>, refusal: G::Refusal) -> Self {
        Self::with_state(
            gate,
            State::Rejected {
                refusal: Some(refusal),
            },
        )
    }

    fn with_state(gate: Arc<G>, state: State<S, Req, G::Refusal>) -> Self {
        Admitting {
            state,
            gate,
            measuring: None,
        }
    }

    /// The layer's settings, to answer the outcome with.
    pub(crate) fn gate(&self) -> &G {
        &self.gate
    }

    pub(crate) fn poll_outcome(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Outcome<S::Response, S::Error, G::Refusal>> {
        let mut this = self.project();
        loop {
            let outcome = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    inner,
                    req,
                    key,
                } => {
                    let result = ready!(Pin::new(&mut *acquire).poll(cx));
                    let latency = acquire.latency();
                    let result = G::fall_back(this.gate, result, key.as_ref());
                    let decided = this.gate.admit(result, latency, key.as_ref());
                    match (decided, inner.take(), req.take()) {
                        (Err(refusal), _, _) => Outcome::Rejected(refusal),
                        (Ok(guard), Some(mut inner), Some(req)) => {
                            if guard.is_some() {
                                *this.measuring = this.gate.measure();
                            }
                            let fut = inner.call(req);
                            this.state.set(State::Calling { fut, guard });
                            continue;
                        }
                        (Ok(_), _, _) => Outcome::Rejected(polled_after_completion(&**this.gate)),
                    }
                }
                StateProj::Calling { fut, guard } => {
                    let result = ready!(fut.poll(cx));
                    Outcome::Passed(result, guard.take())
                }
                StateProj::Rejected { refusal } => match refusal.take() {
                    Some(refusal) => Outcome::Rejected(refusal),
                    None => Outcome::Rejected(polled_after_completion(&**this.gate)),
                },
                StateProj::Done => Outcome::Rejected(polled_after_completion(&**this.gate)),
            };
            this.state.set(State::Done);
            return Poll::Ready(outcome);
        }
    }

    /// [`poll_outcome`](Self::poll_outcome), answered in HTTP mode.
    pub(crate) fn poll_http<B>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<ConcurrencyBody<B>>, S::Error>>
    where
        S: Service<Req, Response = Response<B>>,
    {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        if let Outcome::Passed(result, _) = &outcome {
            let verdict = match result {
                Ok(response) => Verdict::of_response(response),
                Err(_) => Verdict::Failed,
            };
            self.as_mut().measured(verdict);
        }
        Poll::Ready(outcome.into_http(self.gate()))
    }

    /// The call was answered: gives its measurement to the gate.
    fn measured(self: Pin<&mut Self>, verdict: Verdict) {
        let this = self.project();
        if let Some(call) = this.measuring.take() {
            this.gate.measured(call, verdict);
        }
    }

    /// [`poll_outcome`](Self::poll_outcome), answered in typed-error mode.
    pub(crate) fn poll_typed(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Response, BoxError>>
    where
        S::Error: Into<BoxError>,
    {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        if let Outcome::Passed(result, _) = &outcome {
            let verdict = match result {
                Ok(_) => Verdict::Succeeded,
                Err(_) => Verdict::Failed,
            };
            self.as_mut().measured(verdict);
        }
        Poll::Ready(outcome.into_typed(self.gate()))
    }
}

/// A contract violation by the caller; answered, not panicked on.
fn polled_after_completion<G: Gate>(gate: &G) -> G::Refusal {
    gate.broken(StoreError::UnexpectedReply(
        "response future polled after completion".into(),
    ))
}
