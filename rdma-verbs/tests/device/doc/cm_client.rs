// An rdma_cm client: it resolves the server's IP address to a device and a path, makes its
// QP through its id, connects with private data, takes the server's greeting, answers and
// disconnects. rdma_cm works with the IP address of the netdev under the RDMA device (not
// 127.0.0.1): the test bed exports it as RDMA_IP. The server (`serve`, below) runs on a
// thread of the same process.
use std::net::SocketAddr;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel, PortSpace,
    ProtectionDomain, QpType, QueuePair, RecvQueue, SendQueue, SendWr,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let t = Duration::from_secs(10);
    let (server_addr, server) = start_server()?;

    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    id.resolve_addr(None, server_addr, t)?;
    id.resolve_route(t)?;
    let ctx = id.context()?; // the device rdma_cm chose for that address
    let pd = ProtectionDomain::new(&ctx)?;
    let (mut send_cq, mut recv_cq) = (CompletionQueue::new(&ctx, 8)?, CompletionQueue::new(&ctx, 8)?);
    let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &send_cq, &recv_cq).max_send_wr(8).max_recv_wr(8))?;
    let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
    let (mut sq, mut rq) = (qp.send_queue::<Chunk>()?, qp.recv_queue::<Chunk>()?);
    rq.post(bufs.remove(0), 0..4096, 0)?; // before connecting: the server may send at once

    let established = id.connect(&ConnParam::new().private_data(b"hello"), t)?;
    // Private data may come padded with zeros to the transport's size.
    assert!(established.private_data().starts_with(b"welcome"));
    assert_eq!(receive(&mut recv_cq, &mut rq)?, b"what do you want?");
    send(&mut send_cq, &mut sq, bufs.remove(0), b"nothing, thanks")?;
    id.disconnect()?;
    server.join().expect("the server's thread")
}

/// Sends `msg` from `buf` and waits until the peer acknowledged it.
fn send(cq: &mut CompletionQueue, sq: &mut SendQueue<Chunk>, mut buf: Chunk, msg: &[u8]) -> Result<(), BoxError> {
    buf[..msg.len()].copy_from_slice(msg);
    sq.post(SendWr::send(buf, 0..msg.len()))?;
    let mut sent = None;
    sq.complete(&mut poll(cq)?, |done| sent = Some(done.result()))?;
    // A failure is an error naming the operation (SEND), your id and the QP.
    sent.ok_or("the SEND's completion")??;
    Ok(())
}

/// Waits for the next receive and returns its bytes.
fn receive(cq: &mut CompletionQueue, rq: &mut RecvQueue<Chunk>) -> Result<Vec<u8>, BoxError> {
    let done = rq.complete(&mut poll(cq)?)?.result()?;
    Ok(done.value[..done.byte_len as usize].to_vec())
}

fn poll(cq: &mut CompletionQueue) -> rdma_verbs::Result<rdma_verbs::WorkCompletion> {
    loop {
        if let Some(wc) = cq.poll_one()? {
            return Ok(wc);
        }
    }
}

/// A listener on RDMA_IP (a port the kernel picks), served by a thread: it accepts one
/// client, greets it and waits for its answer and its disconnect.
fn start_server() -> Result<(SocketAddr, JoinHandle<Result<(), BoxError>>), BoxError> {
    let ip = std::env::var("RDMA_IP").map_err(|_| "RDMA_IP: the IP address of the netdev under the device")?;
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel, PortSpace::Tcp)?;
    listener.bind(SocketAddr::new(ip.parse()?, 0))?;
    listener.listen(1)?;
    let addr = listener.local_addr().ok_or("a bound listener has an address")?;
    Ok((addr, thread::spawn(move || serve(&listener))))
}

fn serve(listener: &CmId) -> Result<(), BoxError> {
    let t = Duration::from_secs(10);
    let request = listener.get_request(t)?;
    assert!(request.private_data().starts_with(b"hello"));
    let id = request.into_id();
    let ctx = id.context()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let (mut send_cq, mut recv_cq) = (CompletionQueue::new(&ctx, 8)?, CompletionQueue::new(&ctx, 8)?);
    let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &send_cq, &recv_cq).max_send_wr(8).max_recv_wr(8))?;
    let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
    let (mut sq, mut rq) = (qp.send_queue::<Chunk>()?, qp.recv_queue::<Chunk>()?);
    rq.post(bufs.remove(0), 0..4096, 0)?;
    id.accept(&ConnParam::new().private_data(b"welcome"), t)?;
    send(&mut send_cq, &mut sq, bufs.remove(0), b"what do you want?")?;
    assert_eq!(receive(&mut recv_cq, &mut rq)?, b"nothing, thanks");
    assert_eq!(id.next_event(t)?.kind(), CmEventKind::Disconnected);
    Ok(())
}
