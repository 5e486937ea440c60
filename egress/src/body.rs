//! The response body the proxy sends: a short fixed text (refusals,
//! errors, the management endpoint) or the upstream's body streamed frame
//! by frame, never buffered, counting its bytes and writing the request's
//! access line when it ends (or when the client goes away). Also the
//! request body sent upstream: the client's streamed, or one read whole.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::access::{AccessLog, Decision, Pending};

/// A response body.
#[derive(Debug)]
pub enum ProxyBody {
    Fixed(Option<Bytes>),
    Stream(Box<Logged>),
}

impl ProxyBody {
    pub fn text(text: impl Into<Bytes>) -> ProxyBody {
        ProxyBody::Fixed(Some(text.into()))
    }

    pub fn empty() -> ProxyBody {
        ProxyBody::Fixed(None)
    }
}

/// An upstream body on its way to the client.
#[derive(Debug)]
pub struct Logged {
    inner: Incoming,
    line: Option<Line>,
    bytes: u64,
    log: AccessLog,
}

#[derive(Debug)]
struct Line {
    pending: Pending,
    status: u16,
    decision: Decision,
    reason: &'static str,
    token: Option<String>,
}

impl Logged {
    pub fn new(
        inner: Incoming,
        log: AccessLog,
        pending: Pending,
        status: u16,
        token: Option<String>,
    ) -> Logged {
        Logged {
            inner,
            line: Some(Line {
                pending,
                status,
                decision: Decision::Allow,
                reason: "forwarded",
                token,
            }),
            bytes: 0,
            log,
        }
    }

    fn finish(&mut self, reason: Option<&'static str>) {
        if let Some(mut line) = self.line.take() {
            if let Some(reason) = reason {
                line.reason = reason;
            }
            self.log.write(line.pending.finish(
                line.status,
                self.bytes,
                line.decision,
                line.reason,
                line.token,
            ));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // The client went away before the end, or the response was dropped
        // whole (a HEAD, a 101): either way the request gets its line.
        let reason = if self.inner.is_end_stream() {
            None
        } else {
            Some("client-gone")
        };
        self.finish(reason);
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ProxyBody::Fixed(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ProxyBody::Stream(logged) => {
                let polled = Pin::new(&mut logged.inner).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref() {
                            logged.bytes += data.len() as u64;
                        }
                    }
                    Poll::Ready(Some(Err(_))) => logged.finish(Some("upstream-body-error")),
                    Poll::Ready(None) => logged.finish(None),
                    Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Fixed(data) => data.is_none(),
            ProxyBody::Stream(logged) => logged.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Fixed(Some(data)) => SizeHint::with_exact(data.len() as u64),
            ProxyBody::Fixed(None) => SizeHint::with_exact(0),
            ProxyBody::Stream(logged) => logged.inner.size_hint(),
        }
    }
}

/// A request body on its way upstream: the client's, streamed, or one the
/// proxy read whole (a signed AWS request, whose payload hash is computed
/// before it is signed again).
#[derive(Debug)]
pub enum RequestBody {
    Stream(Incoming),
    /// The bytes, and what they hold of a memory budget until the body
    /// has been sent (or dropped).
    Full(Option<Bytes>, Option<crate::signed_body::Hold>),
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> RequestBody {
        RequestBody::Stream(body)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RequestBody::Stream(body) => Pin::new(body).poll_frame(cx),
            RequestBody::Full(data, _) => Poll::Ready(
                data.take()
                    .filter(|d| !d.is_empty())
                    .map(|d| Ok(Frame::data(d))),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Stream(body) => body.is_end_stream(),
            RequestBody::Full(data, _) => data.as_ref().is_none_or(Bytes::is_empty),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Stream(body) => body.size_hint(),
            RequestBody::Full(data, _) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
