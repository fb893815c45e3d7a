//! `multicast`: a UD QP attached to a multicast group receives the datagrams sent to the
//! group, and none once it detached.
//!
//! On RoCE v2 over IPv4, `QueuePair::attach_multicast` tells the device, not the IP
//! stack: rxe sends a datagram to the group as IP multicast on its netdev, and the kernel
//! hands it back to this host only while something here is a member of the IP group. So
//! the example first joins the IP group with a UDP socket (`join_multicast_v4` on the
//! address under the device), as every program attaching by hand must; across hosts the
//! network must carry the group too. `CmId::join_multicast` (rdma_cm) does both joins at
//! once.
//!
//! ```text
//! scripts/rxe cargo run --example multicast
//! ```
//!
//! Two UD QPs on one device (`RDMA_DEVICE`, else the first; its port 1 needs an IPv4
//! RoCE v2 GID): A sends, B is the member. One line per step; the exit code is 0 only
//! when every check passed.

use std::net::{Ipv4Addr, UdpSocket};

#[path = "common/area.rs"]
mod area;
use area::{chunks, ensure, pattern, poll_one, stays_empty, AnyError};

use rdma_verbs::{
    AddressHandle, AhAttr, CompletionQueue, Gid, InitAttr, ProtectionDomain, QpType, QueuePair, SendWr, WcFlags,
    WcStatus, GRH_LEN, MULTICAST_QPN,
};

/// The Q_Key every member's QP and every sender use.
const QKEY: u32 = 0x2468_1357;
/// The group: an administratively scoped IPv4 address, as a GID (`::ffff:239.1.2.5`).
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 5);

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let gid = ctx.default_gid(1)?;
    let local = gid.gid.ipv4().ok_or_else(|| format!("port 1's GID {} is not IPv4 RoCE v2", gid.gid))?;

    // The IP-level join, which attach_multicast does not make.
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.join_multicast_v4(&GROUP, &local)?;
    println!("IP join: a UDP socket is a member of {GROUP} on {local} (the netdev under the device)");

    let pd = ProtectionDomain::new(&ctx)?;
    let ud = |cq: &CompletionQueue| -> Result<QueuePair, AnyError> {
        let qp = QueuePair::builder(&pd, QpType::Ud, cq, cq).max_send_wr(4).max_recv_wr(4).build()?;
        qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() })?;
        Ok(qp)
    };
    let (mut cq_a, mut cq_b) = (CompletionQueue::new(&ctx, 16)?, CompletionQueue::new(&ctx, 16)?);
    let (a, b) = (ud(&cq_a)?, ud(&cq_b)?);
    let (mut sq, mut rq) = (a.send_queue()?, b.recv_queue()?);
    // Every UD receive starts with the 40-byte global route header.
    for (i, c) in chunks(&pd, 2, GRH_LEN + 256)?.into_iter().enumerate() {
        rq.post(c, 0..GRH_LEN + 256, i as u64)?;
    }

    let group = Gid::from(GROUP);
    let member = b.attach_multicast(group, 0)?;
    println!("attach: QP {:#x} is a member of {group}", member.qp_num());

    // To the group: an address handle to the group's GID and the multicast QP number.
    let ah = AddressHandle::new(&pd, &AhAttr::global(1, group, gid.index))?;
    let mut bufs = chunks(&pd, 2, 256)?;
    let data = pattern(0x3c, 200);
    let mut src = bufs.pop().unwrap();
    src[..200].copy_from_slice(&data);
    sq.post(SendWr::send_ud(src, 0..200, &ah, MULTICAST_QPN, QKEY))?;
    let mut status = None;
    sq.complete(&mut poll_one(&mut cq_a)?, |d| status = Some(d.status))?;
    ensure(status == Some(WcStatus::Success), format!("the send to the group: {status:?}"))?;
    let mut wc = poll_one(&mut cq_b)?;
    let got = rq.complete(&mut wc)?.result()?;
    ensure(wc.src_qp() == a.qp_num(), format!("the datagram came from QP {:#x}", wc.src_qp()))?;
    ensure(wc.wc_flags().contains(WcFlags::GRH), "no GRH")?;
    ensure(got.byte_len as usize == GRH_LEN + 200 && got.value[GRH_LEN..GRH_LEN + 200] == data[..], "wrong bytes")?;
    println!("send to the group: 200 bytes arrived at the member from QP {:#x}, byte for byte", a.qp_num());

    member.detach()?;
    sq.post(SendWr::send_ud(bufs.pop().unwrap(), 0..200, &ah, MULTICAST_QPN, QKEY))?;
    sq.complete(&mut poll_one(&mut cq_a)?, |_| ())?;
    ensure(stays_empty(&mut cq_b)?, "a datagram reached the QP after it detached")?;
    println!("detach: a datagram sent to the group afterwards reached no one");
    drop(sock);
    Ok(())
}
