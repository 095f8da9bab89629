use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::{UtilizationSettings, UtilizationShedBody};
use crate::error::BoxError;
use crate::error::StoreError;
use crate::layer::mode;
use crate::lease::LeaseGuard;
use crate::response::Outcome;
use crate::shed::rejection::{Refusal, ShedRejectionKind};
use crate::shed::state::TierSlot;

pin_project! {
    /// The response future of
    /// [`UtilizationShed`](super::UtilizationShed): the inner service's
    /// future holding the request's slot, or a shed request's answer.
    ///
    /// Dropped at any point, it leaves the in-flight count.
    pub struct ResponseFuture<F, M> {
        #[pin]
        state: State<F>,
        settings: Arc<UtilizationSettings>,
        _mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling {
            #[pin]
            fut: F,
            slot: Option<LeaseGuard<TierSlot>>,
        },
        Rejected {
            refusal: Option<Refusal>,
        },
        Done,
    }
}

impl<F, M> ResponseFuture<F, M> {
    pub(crate) fn calling(
        settings: Arc<UtilizationSettings>,
        fut: F,
        slot: LeaseGuard<TierSlot>,
    ) -> Self {
        Self::with_state(
            settings,
            State::Calling {
                fut,
                slot: Some(slot),
            },
        )
    }

    pub(crate) fn rejected(settings: Arc<UtilizationSettings>, refusal: Refusal) -> Self {
        Self::with_state(
            settings,
            State::Rejected {
                refusal: Some(refusal),
            },
        )
    }

    fn with_state(settings: Arc<UtilizationSettings>, state: State<F>) -> Self {
        ResponseFuture {
            state,
            settings,
            _mode: PhantomData,
        }
    }

    fn poll_outcome<R, E>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Outcome<R, E, Refusal, TierSlot>>
    where
        F: Future<Output = Result<R, E>>,
    {
        let mut this = self.project();
        let outcome = match this.state.as_mut().project() {
            StateProj::Calling { fut, slot } => {
                let result = ready!(fut.poll(cx));
                Outcome::Passed(result, slot.take())
            }
            StateProj::Rejected { refusal } => match refusal.take() {
                Some(refusal) => Outcome::Rejected(refusal),
                None => polled_after_completion(this.settings),
            },
            StateProj::Done => polled_after_completion(this.settings),
        };
        this.state.set(State::Done);
        Poll::Ready(outcome)
    }
}

/// A contract violation by the caller; answered, not panicked on.
fn polled_after_completion<R, E>(
    settings: &UtilizationSettings,
) -> Outcome<R, E, Refusal, TierSlot> {
    Outcome::Rejected(Refusal {
        tier: settings.answer.tiers.critical(),
        kind: ShedRejectionKind::Unavailable(StoreError::UnexpectedReply(
            "response future polled after completion".into(),
        )),
    })
}

impl<F, ResBody, E> Future for ResponseFuture<F, mode::Http>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<UtilizationShedBody<ResBody>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        Poll::Ready(outcome.into_http(&*self.settings))
    }
}

impl<F, R, E> Future for ResponseFuture<F, mode::TypedErrors>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
{
    type Output = Result<R, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let outcome = ready!(self.as_mut().poll_outcome(cx));
        Poll::Ready(outcome.into_typed(&*self.settings))
    }
}

impl<F, M> fmt::Debug for ResponseFuture<F, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
