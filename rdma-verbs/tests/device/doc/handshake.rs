// Two RC QPs brought up by the endpoint handshake over TCP, then a SEND each way. Between
// two machines each side is `side` with the TCP stream it has; here both run in one
// process, on one device: a thread listens on 127.0.0.1 and `main` connects to it.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Handshake, ProtectionDomain, QpAccess, QpType, QueuePair,
    SendWr,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let peer = thread::spawn(move || side(listener.accept()?.0, b"hello from the listener"));
    let heard = side(TcpStream::connect(addr)?, b"hello from the connector")?;
    assert_eq!(heard, b"hello from the listener");
    assert_eq!(peer.join().expect("the listener's thread")?, b"hello from the connector");
    Ok(())
}

/// One side: connects its QP to the peer's over `tcp`, sends `msg`, returns what the peer sent.
fn side(mut tcp: TcpStream, msg: &[u8]) -> Result<Vec<u8>, BoxError> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::new(&ctx, 256)?;
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
    // Every read of the exchange gives up after this long.
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;

    let hs = Handshake::new(&qp).access(QpAccess::REMOTE_WRITE);
    hs.init()?; // RESET -> INIT: post receives from here on, before the peer can send
    let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
    let mut rq = qp.recv_queue::<Chunk>()?;
    rq.post(bufs.remove(0), 0..4096, 0)?;
    let conn = hs.connect(&mut tcp)?; // both sides are at RTS when this returns
    println!("connected to {}", conn.remote);

    let mut src = bufs.remove(0);
    src[..msg.len()].copy_from_slice(msg);
    let mut sq = qp.send_queue::<Chunk>()?;
    sq.post(SendWr::send(src, 0..msg.len()))?;
    let (mut heard, mut sent) = (None, None);
    while heard.is_none() || sent.is_none() {
        let Some(mut wc) = cq.poll_one()? else { continue };
        if wc.opcode().is_recv() {
            let done = rq.complete(&mut wc)?.result()?;
            heard = Some(done.value[..done.byte_len as usize].to_vec());
        } else {
            sq.complete(&mut wc, |done| sent = Some(done.result()))?;
        }
    }
    // A failure is an error naming the operation (SEND), your id and the QP.
    sent.ok_or("the SEND's completion")??;
    // Neither side destroys its QP before both are done: a send completes only when the
    // peer's QP acknowledges it.
    tcp.write_all(b"done")?;
    tcp.read_exact(&mut [0; 4])?;
    Ok(heard.unwrap_or_default())
}
