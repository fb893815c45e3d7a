//! `ah_from_completion`: a UD receiver replies to whoever sent a datagram, with an
//! address handle built from the datagram's completion (`ibv_create_ah_from_wc`).
//!
//! A sends a request to B. B takes the receive back from its queue (`rq.complete`),
//! which hands over the buffer and marks the completion taken, and only then builds the
//! reply's address handle from that completion and the first 40 bytes of the buffer (the
//! global route header): `AddressHandle::from_completion` still works on a completion the
//! queue has taken. B replies to the completion's source QP; A checks the reply's bytes
//! and that it came from B.
//!
//! ```text
//! scripts/rxe cargo run --example ah_from_completion
//! ```
//!
//! Two UD QPs on one device (`RDMA_DEVICE`, else the first). One line per step; the exit
//! code is 0 only when every check passed.

#[path = "common/area.rs"]
mod area;
use area::{chunks, ensure, pattern, poll_one, AnyError};

use rdma_verbs::{
    AddressHandle, AhAttr, Chunk, CompletionQueue, InitAttr, ProtectionDomain, QpType, QueuePair, RecvQueue, Remote,
    SendQueue, SendWr, WcStatus, GRH_LEN,
};

const QKEY: u32 = 0x1357_2468;

/// A UD QP with its CQ and queues, two receives posted.
struct Ud {
    cq: CompletionQueue,
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    qp: QueuePair,
}

fn ud(pd: &ProtectionDomain) -> Result<Ud, AnyError> {
    let cq = CompletionQueue::new(pd.context(), 16)?;
    let qp = QueuePair::builder(pd, QpType::Ud, &cq, &cq).max_send_wr(4).max_recv_wr(4).build()?;
    qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() })?;
    let (sq, mut rq) = (qp.send_queue()?, qp.recv_queue()?);
    for (i, c) in chunks(pd, 2, GRH_LEN + 512)?.into_iter().enumerate() {
        rq.post(c, 0..GRH_LEN + 512, i as u64)?;
    }
    Ok(Ud { cq, sq, rq, qp })
}

/// Sends `data` from `u` to QP `qpn` through `ah`, and waits for the send to complete.
fn send(pd: &ProtectionDomain, u: &mut Ud, ah: &AddressHandle, qpn: u32, data: &[u8]) -> Result<(), AnyError> {
    let mut src = chunks(pd, 1, data.len())?.remove(0);
    src.copy_from_slice(data);
    u.sq.post(SendWr::send_ud(src, 0..data.len(), ah, qpn, QKEY))?;
    let mut status = None;
    u.sq.complete(&mut poll_one(&mut u.cq)?, |d| status = Some(d.status))?;
    ensure(status == Some(WcStatus::Success), format!("the send: {status:?}"))
}

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let (mut a, mut b) = (ud(&pd)?, ud(&pd)?);
    let gid = ctx.default_gid(1)?;

    // A knows B's address: its GID and QP number.
    let to_b = AddressHandle::new(&pd, &AhAttr::global(1, b.qp.local_info(1)?.gid, gid.index))?;
    let request = pattern(1, 300);
    send(&pd, &mut a, &to_b, b.qp.qp_num(), &request)?;

    // B takes the datagram: the queue gives the buffer back and marks the completion taken.
    let mut wc = poll_one(&mut b.cq)?;
    let got = b.rq.complete(&mut wc)?.result()?;
    ensure(got.value[GRH_LEN..GRH_LEN + 300] == request[..], "the request's bytes")?;
    println!("request: 300 bytes arrived at B from QP {:#x}", wc.src_qp());

    // The reply's address, from the taken completion and the GRH at the start of the buffer.
    let reply_ah = AddressHandle::from_completion(&pd, 1, &wc, &got.value[..GRH_LEN])?;
    let Remote::Gid { gid: to, sgid_index, .. } = reply_ah.attr().remote else {
        return Err(format!("a reply addressed without a GID: {:?}", reply_ah.attr()).into());
    };
    ensure(to == a.qp.local_info(1)?.gid, format!("the reply goes to {to}, not to A"))?;
    println!("reply address, built after rq.complete(wc): GID {to}, sent from GID index {sgid_index}");

    let reply = pattern(2, 200);
    send(&pd, &mut b, &reply_ah, wc.src_qp(), &reply)?;
    let mut wc = poll_one(&mut a.cq)?;
    let back = a.rq.complete(&mut wc)?.result()?;
    ensure(wc.src_qp() == b.qp.qp_num(), format!("the reply came from QP {:#x}", wc.src_qp()))?;
    ensure(back.byte_len as usize == GRH_LEN + 200 && back.value[GRH_LEN..GRH_LEN + 200] == reply[..], "reply bytes")?;
    println!("reply: 200 bytes arrived back at A from B's QP {:#x}", b.qp.qp_num());
    Ok(())
}
