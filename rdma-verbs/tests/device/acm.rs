//! rdma_cm awaited (`AsyncCmId`, `AsyncEventChannel`) on a real device: an accept loop
//! that serves each connection in its own task with every echoed byte checked, on tokio
//! and on async-io; futures dropped halfway (the id stays usable, or is destroyed
//! cleanly); disconnects awaited on both sides; timeouts that fire within their bound.
//!
//! Each test runs in a process of its own with the leak check of a process that uses
//! rdma_cm (`cm::isolated`: librdmacm keeps a device context open until the process
//! exits), and uses RDMA_IP, the address of the netdev under the device.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_lite::future::poll_once;
use rdma_verbs::{
    AccessFlags, AsyncCmId, AsyncCq, AsyncEventChannel, AsyncIoFd, Chunk, CmEventKind, CmId, CompletionQueue,
    ConnParam, Error, EventChannel, PortSpace, ProtectionDomain, QpType, QueuePair, Readiness, RecvQueue, SendQueue,
    SendWr, TokioFd, Verb, WorkCompletion,
};

use crate::cm::{isolated, rdma_ip};
use crate::datapath::chunks;

/// The bound on every wait of these tests.
const T: Duration = Duration::from_secs(10);
/// Bytes per message.
const LEN: usize = 256;

/// A runtime's adapters: how its CQs and ids become async.
trait Rt: Readiness + Send + Sized + 'static {
    fn cq(cq: CompletionQueue) -> AsyncCq<Self>;
    fn id(id: CmId) -> AsyncCmId<Self>;
}

impl Rt for TokioFd {
    fn cq(cq: CompletionQueue) -> AsyncCq<Self> {
        AsyncCq::tokio(cq).unwrap()
    }
    fn id(id: CmId) -> AsyncCmId<Self> {
        AsyncCmId::tokio(id).unwrap()
    }
}

impl Rt for AsyncIoFd {
    fn cq(cq: CompletionQueue) -> AsyncCq<Self> {
        AsyncCq::async_io(cq).unwrap()
    }
    fn id(id: CmId) -> AsyncCmId<Self> {
        AsyncCmId::async_io(id).unwrap()
    }
}

/// The byte `i` of message `seq` of connection `conn`.
fn pattern(conn: u64, seq: u64, i: usize) -> u8 {
    conn.wrapping_mul(131).wrapping_add(seq.wrapping_mul(7)).wrapping_add(i as u64) as u8
}

/// The QP and queues of a connection's id, its completions awaited; the id is made
/// async first (moved onto a channel of its own), then its QP.
struct Conn<R> {
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    cq: AsyncCq<R>,
    send_buf: Option<Chunk>,
    _qp: QueuePair,
    id: AsyncCmId<R>,
}

impl<R: Rt> Conn<R> {
    fn new(id: AsyncCmId<R>) -> Conn<R> {
        Self::try_new(id).unwrap()
    }

    /// [`new`](Self::new), for an id whose peer may be gone (its QP is then refused).
    fn try_new(id: AsyncCmId<R>) -> rdma_verbs::Result<Conn<R>> {
        let ctx = id.id().context()?;
        let pd = ProtectionDomain::new(&ctx)?;
        let cq = CompletionQueue::builder(&ctx, 16).with_channel().build()?;
        let qp = id.id().create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4))?;
        let mut bufs = chunks(&pd, 2, LEN, AccessFlags::LOCAL_WRITE);
        let (send_buf, recv_buf) = (bufs.pop().unwrap(), bufs.pop().unwrap());
        let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
        rq.post(recv_buf, 0..LEN, 0).unwrap();
        Ok(Conn { sq: qp.send_queue().unwrap(), rq, cq: R::cq(cq), send_buf: Some(send_buf), _qp: qp, id })
    }

    /// SENDs `data` and awaits the send's completion; receives that complete meanwhile
    /// are handed to `got`.
    async fn send(&mut self, data: &[u8], got: &mut Vec<Vec<u8>>) {
        let mut buf = self.send_buf.take().unwrap();
        buf[..data.len()].copy_from_slice(data);
        self.sq.post(SendWr::send(buf, 0..data.len())).unwrap();
        while self.send_buf.is_none() {
            self.next(got).await;
        }
    }

    /// Awaits the next receive.
    async fn recv(&mut self, got: &mut Vec<Vec<u8>>) -> Vec<u8> {
        while got.is_empty() {
            self.next(got).await;
        }
        got.remove(0)
    }

    /// Awaits completions and takes them: the send buffer back, received bytes into
    /// `got` (the receive posted again).
    async fn next(&mut self, got: &mut Vec<Vec<u8>>) {
        let mut wcs = [WorkCompletion::EMPTY; 4];
        let wcs = tokio_free_timeout(self.cq.completions(&mut wcs)).await;
        for wc in wcs {
            if wc.opcode().is_recv() {
                let done = self.rq.complete(wc).unwrap().result().unwrap();
                got.push(done.value[..done.byte_len as usize].to_vec());
                self.rq.post(done.value, 0..LEN, 0).unwrap();
            } else {
                let send_buf = &mut self.send_buf;
                self.sq.complete(wc, |d| *send_buf = Some(d.result().unwrap().value)).unwrap();
            }
        }
    }
}

/// Awaits a data-path future; a lost completion shows as the test process's own
/// timeout (`isolated` bounds the whole test), so no runtime's timer is needed here.
async fn tokio_free_timeout<F: std::future::Future<Output = rdma_verbs::Result<T>>, T>(f: F) -> T {
    f.await.unwrap()
}

/// A listener on RDMA_IP, on a port the kernel picks, its requests awaited.
fn listener<R: Rt>() -> (AsyncCmId<R>, SocketAddr) {
    let id = CmId::new(&EventChannel::new().unwrap(), PortSpace::Tcp).unwrap();
    let id = R::id(id);
    id.id().bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    id.id().listen(16).unwrap();
    let addr = id.id().local_addr().unwrap();
    (id, addr)
}

/// A client id resolved to `server`, awaited.
async fn resolved<R: Rt>(server: SocketAddr) -> AsyncCmId<R> {
    let mut id = R::id(CmId::new(&EventChannel::new().unwrap(), PortSpace::Tcp).unwrap());
    id.resolve_addr(None, server, T).await.unwrap();
    id.resolve_route(T).await.unwrap();
    assert_eq!(id.id().peer_addr(), Some(server));
    id
}

/// The server side of one connection: accepts, echoes `messages` messages, and awaits
/// the end of the connection (it disconnects too).
async fn serve<R: Rt>(request: rdma_verbs::ConnectRequest) {
    let messages = u64::from_le_bytes(request.private_data()[..8].try_into().unwrap());
    let mut c = Conn::new(R::id(request.into_id()));
    c.id.accept(&ConnParam::new(), T).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..messages {
        let m = c.recv(&mut got).await;
        c.send(&m, &mut got).await;
    }
    c.id.disconnect(T).await.unwrap();
}

/// Client `n`: connects with its message count, sends each message and checks its
/// echo byte for byte, then awaits its disconnect.
async fn talk<R: Rt>(n: u64, server: SocketAddr, messages: u64) {
    let mut c = Conn::new(resolved::<R>(server).await);
    let count = messages.to_le_bytes();
    let established = c.id.connect(&ConnParam::new().private_data(&count), T).await.unwrap();
    assert_eq!(established.kind(), CmEventKind::Established);
    assert!(established.conn().unwrap().qp_num > 1, "the ESTABLISHED event names the server's QP");
    let mut got = Vec::new();
    for seq in 0..messages {
        let m: Vec<u8> = (0..LEN).map(|i| pattern(n, seq, i)).collect();
        c.send(&m, &mut got).await;
        assert_eq!(c.recv(&mut got).await, m, "connection {n}: echo {seq} differs from what was sent");
    }
    c.id.disconnect(T).await.unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_tokio_accept_loop_serves_each_connection_in_its_own_task_and_every_echo_matches() {
    isolated(this_test!(), || {
        const CONNS: u64 = 4;
        const MESSAGES: u64 = 20;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let (mut listener, addr) = listener::<TokioFd>();
            let server = tokio::spawn(async move {
                let mut tasks = Vec::new();
                for _ in 0..CONNS {
                    let request = listener.get_request(T).await.unwrap();
                    tasks.push(tokio::spawn(serve::<TokioFd>(request)));
                }
                for t in tasks {
                    t.await.unwrap();
                }
            });
            let clients: Vec<_> = (0..CONNS).map(|n| tokio::spawn(talk::<TokioFd>(n, addr, MESSAGES))).collect();
            for c in clients {
                c.await.unwrap();
            }
            server.await.unwrap();
        });
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_async_io_accept_loop_serves_each_connection_on_its_own_and_every_echo_matches() {
    isolated(this_test!(), || {
        const CONNS: u64 = 3;
        const MESSAGES: u64 = 20;
        let (mut listener, addr) = listener::<AsyncIoFd>();
        let server = std::thread::spawn(move || {
            async_io::block_on(async {
                let mut served = Vec::new();
                for _ in 0..CONNS {
                    let request = listener.get_request(T).await.unwrap();
                    // async-io brings a reactor, no executor: each connection on a thread.
                    served.push(std::thread::spawn(move || async_io::block_on(serve::<AsyncIoFd>(request))));
                }
                for s in served {
                    s.join().unwrap();
                }
            })
        });
        let clients: Vec<_> = (0..CONNS)
            .map(|n| std::thread::spawn(move || async_io::block_on(talk::<AsyncIoFd>(n, addr, MESSAGES))))
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        server.join().unwrap();
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn dropped_get_request_connect_and_accept_futures_leave_the_ids_usable_and_destroyable() {
    isolated(this_test!(), || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (mut listener, addr) = listener::<TokioFd>();
            // A get_request dropped before any request came: nothing is lost.
            assert!(poll_once(listener.get_request(T)).await.is_none(), "no request yet");

            // A connect dropped after rdma_connect went out (the server has not accepted,
            // so no answer can have come): the REQ stays sent.
            let mut client = Conn::new(resolved::<TokioFd>(addr).await);
            assert!(poll_once(client.id.connect(&ConnParam::new(), T)).await.is_none(), "not accepted yet");

            // The request of the dropped connect reaches the next get_request.
            let request = listener.get_request(T).await.unwrap();
            let mut server = Conn::new(TokioFd::id(request.into_id()));
            // An accept dropped after its first poll: rdma_accept is done (REP sent), its
            // ESTABLISHED comes later (once the client's librdmacm has read the answer and
            // sent its RTU); it is the id's next event then.
            let accepted = poll_once(server.id.accept(&ConnParam::new(), T)).await;
            futures_lite::future::zip(
                async {
                    match accepted {
                        Some(r) => r.unwrap(),
                        None => {
                            let ev = server.id.next_event(T).await.unwrap();
                            assert_eq!(ev.kind(), CmEventKind::Established, "{ev:?}");
                        }
                    }
                },
                async {
                    // The client's ESTABLISHED, which its dropped connect did not take.
                    let ev = client.id.next_event(T).await.unwrap();
                    assert_eq!(ev.kind(), CmEventKind::Established, "{ev:?}");
                },
            )
            .await;

            // Both ids work: a message goes across and back.
            let (mut got_c, mut got_s) = (Vec::new(), Vec::new());
            let m: Vec<u8> = (0..LEN).map(|i| pattern(9, 1, i)).collect();
            client.send(&m, &mut got_c).await;
            let echo = server.recv(&mut got_s).await;
            server.send(&echo, &mut got_s).await;
            assert_eq!(client.recv(&mut got_c).await, m);

            // The server hangs up first; both sides await their DISCONNECTED.
            both_disconnect(&mut server, &mut client).await;

            // A connect dropped and its id destroyed at once, its request never taken: the
            // listener's queue and the leak check see everything go.
            let mut gone = Conn::new(resolved::<TokioFd>(addr).await);
            assert!(poll_once(gone.id.connect(&ConnParam::new(), T)).await.is_none());
            drop(gone);
            drop((client, server));
            // The listener still serves after all this.
            let (connect, request) = futures_lite::future::zip(
                async {
                    let mut c = Conn::new(resolved::<TokioFd>(addr).await);
                    c.id.connect(&ConnParam::new(), T).await.map(|_| c)
                },
                async {
                    loop {
                        let request = listener.get_request(T).await.unwrap();
                        // The request of the destroyed client, if it came, fails: its QP
                        // is refused, or its accept.
                        let mut s = match Conn::try_new(TokioFd::id(request.into_id())) {
                            Ok(s) => s,
                            Err(e) => {
                                eprintln!("the destroyed client's request: {e}");
                                continue;
                            }
                        };
                        match s.id.accept(&ConnParam::new(), T).await {
                            Ok(()) => return s,
                            Err(e) => eprintln!("the destroyed client's request: {e}"),
                        }
                    }
                },
            )
            .await;
            let (mut c, mut s) = (connect.unwrap(), request);
            both_disconnect(&mut c, &mut s).await;
        });
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaited_waits_time_out_within_their_bound_and_the_ids_stay_usable() {
    isolated(this_test!(), || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (mut listener, addr) = listener::<TokioFd>();
            let bound = Duration::from_millis(300);
            let start = Instant::now();
            let e = listener.get_request(bound).await.unwrap_err();
            let took = start.elapsed();
            assert!(matches!(e, Error::Timeout { verb: Verb::GetCmEvent, timeout } if timeout == bound), "{e}");
            assert!(took >= bound && took < bound + Duration::from_secs(3), "timed out after {took:?}");
            // A zero timeout only looks.
            let e = listener.next_event(Duration::ZERO).await.unwrap_err();
            assert!(matches!(e, Error::Timeout { .. }), "{e}");

            // The channel of its own, awaited directly: nothing for it either.
            let mut bare = AsyncEventChannel::tokio(EventChannel::new().unwrap()).unwrap();
            let e = bare.next_event(Duration::from_millis(50)).await.unwrap_err();
            assert!(matches!(e, Error::Timeout { verb: Verb::GetCmEvent, .. }), "{e}");

            // After the timeouts the listener takes a request as usual.
            let (client, server) = futures_lite::future::zip(
                async {
                    let mut c = Conn::new(resolved::<TokioFd>(addr).await);
                    c.id.connect(&ConnParam::new(), T).await.unwrap();
                    c
                },
                async {
                    let request = listener.get_request(T).await.unwrap();
                    let mut s = Conn::new(TokioFd::id(request.into_id()));
                    s.id.accept(&ConnParam::new(), T).await.unwrap();
                    s
                },
            )
            .await;
            let (mut c, mut s) = (client, server);
            // Nobody disconnects: a short disconnect wait on a connected id, the peer silent,
            // still ends in time (with DISCONNECTED or the timeout, never later).
            let start = Instant::now();
            let _ = c.id.next_event(Duration::from_millis(100)).await.unwrap_err();
            assert!(start.elapsed() < Duration::from_secs(3));
            both_disconnect(&mut c, &mut s).await;
        });
    });
}

/// Both sides disconnect at once and each awaits its DISCONNECTED: the answer to one
/// side's disconnect request is the other side's disconnect (or, much later, the CM's
/// timeout).
async fn both_disconnect<R: Rt>(a: &mut Conn<R>, b: &mut Conn<R>) {
    let (ra, rb) = futures_lite::future::zip(a.id.disconnect(T), b.id.disconnect(T)).await;
    ra.unwrap();
    rb.unwrap();
}

/// A QP for a blocking id (made before it connects).
fn qp_for(id: &CmId) -> QueuePair {
    let ctx = id.context().unwrap();
    let (pd, cq) = (ProtectionDomain::new(&ctx).unwrap(), CompletionQueue::new(&ctx, 8).unwrap());
    id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(2).max_recv_wr(2)).unwrap()
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_async_event_channel_gets_its_request_even_when_a_blocking_reader_reads_it_first() {
    isolated(this_test!(), || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            // A listener and another id on one channel, awaited as a whole.
            let channel = EventChannel::new().unwrap();
            let listen = CmId::new(&channel, PortSpace::Tcp).unwrap();
            listen.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
            listen.listen(4).unwrap();
            let addr = listen.local_addr().unwrap();
            let other = CmId::new(&channel, PortSpace::Tcp).unwrap();
            let mut events = AsyncEventChannel::tokio(channel).unwrap();

            // A blocking waiter for the other id reads the channel too: whichever reads the
            // request queues it, and the parked task is woken for it either way.
            let reader = std::thread::spawn(move || {
                let r = other.next_event(Duration::from_secs(3));
                (other, r)
            });
            // A blocking client on a thread: its request is refused, so it ends.
            let client = std::thread::spawn(move || {
                let id = CmId::new(&EventChannel::new().unwrap(), PortSpace::Tcp).unwrap();
                id.resolve_addr(None, addr, T).unwrap();
                id.resolve_route(T).unwrap();
                let _qp = qp_for(&id);
                id.connect(&ConnParam::new(), T).map(drop)
            });
            let mut ev = events.next_event(T).await.unwrap();
            assert_eq!(ev.kind(), CmEventKind::ConnectRequest, "{ev:?}");
            assert!(ev.is_for(&listen));
            ev.take_request().unwrap().reject(b"not today").unwrap();
            let refused = client.join().unwrap().unwrap_err();
            assert!(matches!(refused, Error::Rejected { .. }), "{refused}");
            let (other, r) = reader.join().unwrap();
            assert!(matches!(r, Err(Error::Timeout { .. })), "the other id had no event: {r:?}");
            drop((other, listen, events));
        });
    });
}
