//! The HTTP side of `--metrics-port`: hyper's HTTP/1 server on a small tokio runtime of
//! the endpoint's own thread, so that clients are served at once, each within its own
//! bounded time, and one that holds the port idle or trickles its request delays no one.
//!
//! - The allow-list is checked on the peer's address as the connection is accepted: a
//!   client outside it is closed before a byte is read.
//! - At most [`MAX_CONNECTIONS`] connections at once; past that, new clients wait in the
//!   kernel's backlog until one ends (each ends within its bounded time).
//! - A client has [`REQUEST_TIMEOUT`] from its accept to send its whole request head (at
//!   most [`MAX_REQUEST_BYTES`]; hyper answers a larger one 431), and [`REQUEST_TIMEOUT`]
//!   again to take the answer once it is ready; else its connection is closed. The time a
//!   diagnosis takes for a scrape is not the client's.
//! - The answers are computed on at most [`ANSWER_THREADS`] blocking threads (a diagnosis
//!   waits for the one running, see [`crate::fresh`]).
//! - One request per connection (`Connection: close`), as Prometheus copes with.

use std::convert::Infallible;
use std::net::TcpListener;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE as CONTENT_TYPE_HEADER;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use super::{CONTENT_TYPE, MAX_REQUEST_BYTES, REQUEST_TIMEOUT};
use crate::modes::gate::AllowList;

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// The most answers computed at once.
pub const ANSWER_THREADS: usize = 4;

/// What computes a scrape's body.
type Metrics = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Serves until accepting fails; the error is why.
pub fn serve(listener: TcpListener, allow: &AllowList, metrics: Metrics) -> std::io::Error {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(ANSWER_THREADS)
        .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Err(e) = listener.set_nonblocking(true) {
        return e;
    }
    runtime.block_on(accept(listener, allow.clone(), metrics))
}

async fn accept(listener: TcpListener, allow: AllowList, metrics: Metrics) -> std::io::Error {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot before the accept: past the bound, clients wait in the backlog.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return std::io::Error::other("the connection slots closed");
        };
        match listener.accept().await {
            Ok((stream, from)) if !allow.admits(from.ip()) => drop(stream),
            Ok((stream, _)) => {
                let metrics = Arc::clone(&metrics);
                tokio::spawn(async move {
                    connection(stream, metrics).await;
                    drop(slot);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
            Err(e) => return e,
        }
    }
}

/// One connection, closed at its deadline: [`REQUEST_TIMEOUT`] after the accept, none
/// while its answer is computed, [`REQUEST_TIMEOUT`] after the answer is ready.
async fn connection(stream: tokio::net::TcpStream, metrics: Metrics) {
    let (deadline, mut deadline_rx) = watch::channel(Some(Instant::now() + REQUEST_TIMEOUT));
    let service = service_fn(move |request| {
        let (metrics, deadline) = (Arc::clone(&metrics), deadline.clone());
        async move { Ok::<_, Infallible>(answer(request, metrics, deadline).await) }
    });
    let conn = http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut watching = true;
    loop {
        let at = *deadline_rx.borrow_and_update();
        let expiry = async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // A client that misbehaves costs it its answer, nothing more.
            _ = &mut conn => return,
            // Dropping the connection closes it.
            () = expiry => return,
            changed = deadline_rx.changed(), if watching => watching = changed.is_ok(),
        }
    }
}

/// The answer to one request: the metrics for `GET /metrics`, 404 for another path, 405
/// for another method.
async fn answer(
    request: Request<Incoming>,
    metrics: Metrics,
    deadline: watch::Sender<Option<Instant>>,
) -> Response<Full<Bytes>> {
    let (status, kind, body) = if request.method() != Method::GET {
        (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET /metrics only\n".to_owned())
    } else if request.uri().path() != "/metrics" {
        (StatusCode::NOT_FOUND, "text/plain", "the metrics are at /metrics\n".to_owned())
    } else {
        deadline.send_replace(None);
        let computed = tokio::task::spawn_blocking(move || metrics()).await;
        deadline.send_replace(Some(Instant::now() + REQUEST_TIMEOUT));
        match computed {
            Ok(Ok(text)) => (StatusCode::OK, CONTENT_TYPE, text),
            Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("the metrics failed: {e}\n")),
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    // An HTTP/1.0 client gets an HTTP/1.0 answer.
    *response.version_mut() = request.version();
    response.headers_mut().insert(CONTENT_TYPE_HEADER, hyper::header::HeaderValue::from_static(kind));
    response
}
