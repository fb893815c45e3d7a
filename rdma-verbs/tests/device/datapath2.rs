//! The safe data path, part two: message sizes up to several MiB and across memory
//! regions, immediate data, UD with its GRH, an SRQ shared by two QPs, the two sides of a
//! QP on their own threads, completion-channel waiting, inline data, refusals that leave
//! the queues usable, and completion moderation. Every byte that arrives is compared with
//! what was sent, and bytes next to it are checked untouched.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdma_verbs::Chunk;
use rdma_verbs::QueuePairBuilder;
use rdma_verbs::{
    AccessFlags, AddressHandle, AhAttr, AlignedBuf, CompletionQueue, Error, InitAttr, ProtectionDomain, QpAccess,
    QpType, QueuePair, Refused, SharedReceiveQueue, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use rdma_verbs::{Done, ExclusiveBuf, RecvQueue, SendBuf, SendQueue, SendWr};

use crate::datapath::{chunks, poll_one, random_bytes, rc_pair, Side, PAIR_DEPTH};
use crate::{connect_rc, gid_index, open, LeakCheck, Link};

/// Bytes of the global route header in front of every UD receive on RoCE.
const GRH: usize = 40;
/// Fills receive buffers and targets before a transfer, to see what was not written.
const UNTOUCHED: u8 = 0xee;
const MIB: usize = 1 << 20;

/// One end of an RC connection with a CQ for each side, so that the send and receive
/// sides can be driven from different threads.
struct End<S: SendBuf, R: ExclusiveBuf = Chunk> {
    sq: SendQueue<S>,
    rq: RecvQueue<R>,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
    _link: Arc<Link>,
}

/// Two connected RC QPs of `pd`, each built through `tune`; with `recv_channel` the
/// receive CQs have a completion channel.
fn connected<S: SendBuf, R: ExclusiveBuf>(
    pd: &ProtectionDomain,
    access: QpAccess,
    recv_channel: bool,
    tune: impl for<'a> Fn(QueuePairBuilder<'a>) -> QueuePairBuilder<'a>,
) -> (End<S, R>, End<S, R>) {
    let ctx = pd.context();
    let make = || {
        let scq = CompletionQueue::new(ctx, 512).unwrap();
        let rcq = if recv_channel {
            CompletionQueue::builder(ctx, 512).with_channel().build().unwrap()
        } else {
            CompletionQueue::new(ctx, 512).unwrap()
        };
        let qp = tune(QueuePair::builder(pd, QpType::Rc, &scq, &rcq)).build().unwrap();
        (scq, rcq, qp)
    };
    let (a, b) = (make(), make());
    let link = Arc::new(connect(&a.2, &b.2, access));
    let end = |(scq, rcq, qp): (CompletionQueue, CompletionQueue, QueuePair)| End {
        sq: qp.send_queue().unwrap(),
        rq: qp.recv_queue().unwrap(),
        scq,
        rcq,
        qp,
        _link: Arc::clone(&link),
    };
    (end(a), end(b))
}

fn connect(a: &QueuePair, b: &QueuePair, access: QpAccess) -> Link {
    connect_rc(a, b, &InitAttr { access, ..InitAttr::default() })
}

/// A region of `len` bytes that peers may write and read, filled with [`UNTOUCHED`].
fn target(pd: &ProtectionDomain, len: usize) -> rdma_verbs::MemoryRegion<AlignedBuf, rdma_verbs::RemoteWritable> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut t = pd.register_remote_writable(AlignedBuf::new(len).unwrap(), access).unwrap();
    t.write_at(0, &vec![UNTOUCHED; len]).unwrap();
    t
}

/// Compares without printing megabytes: names the first differing byte.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got != want {
        let i = got.iter().zip(want).position(|(g, w)| g != w).unwrap();
        panic!("{what}: first difference at byte {i} of {}: got {:#04x}, want {:#04x}", want.len(), got[i], want[i]);
    }
}

#[track_caller]
fn untouched(got: &[u8], what: &str) {
    if let Some(i) = got.iter().position(|&b| b != UNTOUCHED) {
        panic!("{what}: byte {i} of {} was written ({:#04x})", got.len(), got[i]);
    }
}

/// Reads `len` bytes of a remote-writable region at `offset`.
fn read_back(
    t: &rdma_verbs::MemoryRegion<AlignedBuf, rdma_verbs::RemoteWritable>,
    offset: usize,
    len: usize,
) -> Vec<u8> {
    let mut v = vec![0u8; len];
    t.read_at(offset, &mut v).unwrap();
    v
}

#[track_caller]
fn posted<X>(r: Result<(), Refused<X>>) {
    if let Err(Refused { error: e, .. }) = r {
        panic!("post refused: {e}");
    }
}

/// Takes the next send completion of `cq` (which must succeed) and returns what it released.
#[track_caller]
fn sent<S: SendBuf>(sq: &mut SendQueue<S>, cq: &mut CompletionQueue) -> Vec<Done<S>> {
    let mut wc = poll_one(cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    let mut out = Vec::new();
    sq.complete(&mut wc, |d| out.push(d)).unwrap();
    out
}

#[track_caller]
fn sent_one<S: SendBuf>(sq: &mut SendQueue<S>, cq: &mut CompletionQueue) -> Done<S> {
    let mut done = sent(sq, cq);
    assert_eq!(done.len(), 1, "one signaled request, one release");
    done.pop().unwrap()
}

/// Takes the next receive completion of `cq` (which must succeed).
#[track_caller]
fn received<R: ExclusiveBuf>(rq: &mut RecvQueue<R>, cq: &mut CompletionQueue) -> (WorkCompletion, Done<R>) {
    let mut wc = poll_one(cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    let done = rq.complete(&mut wc).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    (wc, done)
}

/// Nothing more arrives on `cq` within a moment.
#[track_caller]
fn quiet(cq: &mut CompletionQueue) {
    std::thread::sleep(Duration::from_millis(100));
    let mut wc = [WorkCompletion::EMPTY; 4];
    let extra = cq.poll(&mut wc).unwrap();
    assert!(extra.is_empty(), "unexpected completions: {extra:?}");
}

/// The text of a refusal made before C by `method`, which it must name first (and, for
/// a post, say that nothing was posted).
#[track_caller]
fn invalid_text(e: &Error, method: &str) -> String {
    match e {
        Error::InvalidArgument { verb, .. } if verb.name() == method => {
            let text = e.to_string();
            assert!(text.starts_with(&format!("{method}: ")), "{text}");
            if verb.posts_through().is_some() {
                assert!(text.contains("nothing posted"), "{text}");
            }
            text
        }
        other => panic!("expected a refusal by {method} before C, got {other}"),
    }
}

/// The largest message of the size tests: 4 MiB, or the port's max_msg_sz if smaller.
fn big_len(pd: &ProtectionDomain) -> usize {
    let max_msg = pd.context().query_port(1).unwrap().raw.max_msg_sz as usize;
    let big = (4 * MIB).min(max_msg);
    assert!(big >= MIB, "max_msg_sz {max_msg} is below 1 MiB");
    big
}

const SIZES: [usize; 5] = [0, 1, 4095, 4096, 4097];

// ---- 1. sizes -------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn send_of_0_1_4095_4096_4097_bytes_and_4_mib_arrives_byte_exact() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    let big = big_len(&pd);
    let mut src = chunks(&pd, 1, big, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let mut dst = chunks(&pd, 1, big + 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    for (i, n) in SIZES.into_iter().chain([big]).enumerate() {
        let data = random_bytes(i as u64 + 1, n);
        src[..n].copy_from_slice(&data);
        dst.fill(UNTOUCHED);
        let dst_len = dst.len();
        posted(b.rq.post(dst, 0..dst_len, n as u64));
        posted(a.sq.post(SendWr::send(src, 0..n).id(n as u64)));
        let done = sent_one(&mut a.sq, &mut a.cq);
        assert_eq!(done.id, n as u64);
        src = done.value;
        let (wc, got) = received(&mut b.rq, &mut b.cq);
        assert_eq!((wc.opcode(), wc.imm_data()), (WcOpcode::Recv, None));
        assert_eq!((got.id, got.byte_len as usize), (n as u64, n), "{n}-byte SEND");
        same(&got.value[..n], &data, &format!("{n}-byte SEND"));
        untouched(&got.value[n..], &format!("receive buffer past a {n}-byte SEND"));
        dst = got.value;
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn rdma_write_of_0_1_4095_4096_4097_bytes_and_4_mib_lands_byte_exact_at_an_odd_offset() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let big = big_len(&pd);
    // 7: the remote address is not aligned to anything.
    let (off, slack) = (7, 64);
    let mut t = target(&pd, off + big + slack);
    let remote = t.remote().unwrap().slice(off as u64..).unwrap();
    let mut src = chunks(&pd, 1, big, AccessFlags::LOCAL_WRITE).pop().unwrap();
    for (i, n) in SIZES.into_iter().chain([big]).enumerate() {
        let data = random_bytes(i as u64 + 100, n);
        src[..n].copy_from_slice(&data);
        t.write_at(0, &vec![UNTOUCHED; off + n + slack]).unwrap();
        posted(a.sq.post(SendWr::write(src, 0..n, remote).id(i as u64)));
        let done = sent_one(&mut a.sq, &mut a.cq);
        assert_eq!((done.id, done.status), (i as u64, WcStatus::Success));
        src = done.value;
        same(&read_back(&t, off, n), &data, &format!("{n}-byte RDMA WRITE"));
        untouched(&read_back(&t, 0, off), &format!("target before a {n}-byte WRITE"));
        untouched(&read_back(&t, off + n, slack), &format!("target after a {n}-byte WRITE"));
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_message_gathered_from_two_regions_is_scattered_into_two_other_regions_by_send_write_and_read() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ;
    let (mut a, mut b) = connected::<[Chunk; 2], [Chunk; 2]>(&pd, access, false, |q| q.max_send_sge(2).max_recv_sge(2));
    let one = |len| chunks(&pd, 1, len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).pop().unwrap();
    // Four chunks, each of its own memory region.
    let (mut x, mut y, mut p, mut q) = (one(3000), one(5000), one(2500), one(6000));
    let lkeys = [x.lkey(), y.lkey(), p.lkey(), q.lkey()];
    assert!((1..4).all(|i| !lkeys[..i].contains(&lkeys[i])), "four regions, four lkeys: {lkeys:?}");
    let data = random_bytes(7, 8000);
    x.copy_from_slice(&data[..3000]);
    y.copy_from_slice(&data[3000..]);
    p.fill(UNTOUCHED);
    q.fill(UNTOUCHED);

    // SEND bytes 1000..7000 of x|y (two SGEs) into p|q (two SGEs, split at 2500).
    posted(b.rq.post([p, q], 0..8500, 1));
    posted(a.sq.post(SendWr::send([x, y], 1000..7000)));
    let [x, y] = sent_one(&mut a.sq, &mut a.scq).value;
    let (_, got) = received(&mut b.rq, &mut b.rcq);
    assert_eq!(got.byte_len, 6000);
    let [mut p, mut q] = got.value;
    same(&p, &data[1000..3500], "first receive region");
    same(&q[..3500], &data[3500..7000], "second receive region");
    untouched(&q[3500..], "second receive region past the message");

    // RDMA WRITE bytes 500..7500 of x|y to a remote region.
    let mut t = target(&pd, 8192);
    let remote = t.remote().unwrap();
    posted(a.sq.post(SendWr::write([x, y], 500..7500, remote)));
    let [x, y] = sent_one(&mut a.sq, &mut a.scq).value;
    same(&read_back(&t, 0, 7000), &data[500..7500], "WRITE gathered from two regions");
    untouched(&read_back(&t, 7000, 1192), "target past the WRITE");

    // RDMA READ 8000 remote bytes into bytes 100..8100 of p|q.
    let tdata = random_bytes(8, 8192);
    t.write_at(0, &tdata).unwrap();
    p.fill(UNTOUCHED);
    q.fill(UNTOUCHED);
    posted(a.sq.post(SendWr::read([p, q], 100..8100, remote.slice(..8000).unwrap())));
    // a's send queue holds [x, y] no more, but the READ target is a [Chunk; 2] as well.
    let [p, q] = sent_one(&mut a.sq, &mut a.scq).value;
    untouched(&p[..100], "first READ region before the range");
    same(&p[100..], &tdata[..2400], "READ scattered into the first region");
    same(&q[..5600], &tdata[2400..8000], "READ scattered into the second region");
    untouched(&q[5600..], "second READ region past the range");

    // The SGE count is checked against the QP's max_send_sge before C: a range over more
    // segments than that is refused, one over that many goes through.
    drop(a.sq);
    let mut sq8 = a.qp.send_queue::<[Chunk; 8]>().unwrap();
    let max = a.qp.caps().max_send_sge as usize;
    assert!((2..8).contains(&max), "max_send_sge {max}: this test needs 2..8");
    let segs: [Chunk; 8] = chunks(&pd, 8, 100, AccessFlags::LOCAL_WRITE).try_into().unwrap();
    let text = match sq8.post(SendWr::write(segs, 0..(max + 1) * 100, remote)) {
        Err(Refused { error: e, .. }) => invalid_text(&e, "SendQueue::post"),
        Ok(()) => panic!("{} SGEs posted on a QP that takes {max}", max + 1),
    };
    assert!(text.contains("max_send_sge"), "{text}");
    assert_eq!(sq8.outstanding(), 0);
    let mut segs: [Chunk; 8] = chunks(&pd, 8, 100, AccessFlags::LOCAL_WRITE).try_into().unwrap();
    let wdata = random_bytes(9, max * 100);
    for (s, d) in segs.iter_mut().zip(wdata.chunks(100)) {
        s.copy_from_slice(d);
    }
    posted(sq8.post(SendWr::write(segs, 0..max * 100, remote)));
    sent_one(&mut sq8, &mut a.scq);
    same(&read_back(&t, 0, max * 100), &wdata, &format!("WRITE of {max} SGEs"));
    drop((x, y, p, q));
}

// ---- 2. immediate data --------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn send_with_imm_and_write_with_imm_deliver_the_immediate_and_write_with_imm_consumes_a_receive() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut bufs = chunks(&pd, 2, 4096, AccessFlags::LOCAL_WRITE);
    let (mut src, mut dst) = (bufs.remove(0), bufs.remove(0));

    // SEND with immediate: each value arrives in host order, with the payload.
    for (i, imm) in [Some(0), Some(1), Some(0x1234_5678), Some(u32::MAX), None].into_iter().enumerate() {
        let data = random_bytes(20 + i as u64, 100 + i);
        src[..data.len()].copy_from_slice(&data);
        dst.fill(UNTOUCHED);
        posted(b.rq.post(dst, 0..4096, i as u64));
        let wr = SendWr::send(src, 0..data.len());
        posted(a.sq.post(match imm {
            Some(v) => wr.imm(v),
            None => wr,
        }));
        src = sent_one(&mut a.sq, &mut a.cq).value;
        let (wc, got) = received(&mut b.rq, &mut b.cq);
        assert_eq!((wc.opcode(), wc.imm_data()), (WcOpcode::Recv, imm), "{wc:?}");
        assert_eq!(wc.wc_flags().contains(WcFlags::WITH_IMM), imm.is_some());
        assert_eq!((got.id, got.byte_len as usize), (i as u64, data.len()));
        same(&got.value[..data.len()], &data, "SEND with immediate");
        dst = got.value;
    }

    // RDMA WRITE with immediate: the bytes land in the target, the immediate arrives
    // through a receive, whose buffer the write does not touch.
    let t = target(&pd, 2048);
    for (i, (n, imm)) in [(1000usize, 0xcafe_babe_u32), (0, 7)].into_iter().enumerate() {
        let data = random_bytes(30 + i as u64, n);
        src[..n].copy_from_slice(&data);
        dst.fill(UNTOUCHED);
        posted(b.rq.post(dst, 0..4096, 50 + i as u64));
        posted(a.sq.post(SendWr::write(src, 0..n, t.remote().unwrap().slice(1000..).unwrap()).imm(imm)));
        src = sent_one(&mut a.sq, &mut a.cq).value;
        let (wc, got) = received(&mut b.rq, &mut b.cq);
        assert_eq!((wc.opcode(), wc.imm_data()), (WcOpcode::RecvRdmaWithImm, Some(imm)), "{wc:?}");
        assert_eq!((got.id, got.byte_len as usize), (50 + i as u64, n), "the receive reports the write's length");
        untouched(&got.value, "receive buffer of a WRITE with immediate");
        same(&read_back(&t, 1000, n), &data, &format!("{n}-byte WRITE with immediate"));
        assert_eq!(b.rq.outstanding(), 0, "the WRITE with immediate consumed the receive");
        dst = got.value;
    }
    untouched(&read_back(&t, 0, 1000), "target before the writes");
    drop((src, dst));
}

// ---- 3. UD ----------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn ud_datagrams_arrive_after_a_40_byte_grh_from_the_senders_qp_and_a_wrong_qkey_is_dropped() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut cq_a, mut cq_b) = (CompletionQueue::new(&ctx, 64).unwrap(), CompletionQueue::new(&ctx, 64).unwrap());
    // 32 + 32 work requests each: the 64-entry CQs hold both queues' completions.
    let a = QueuePair::builder(&pd, QpType::Ud, &cq_a, &cq_a).max_send_wr(32).max_recv_wr(32).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Ud, &cq_b, &cq_b).max_send_wr(32).max_recv_wr(32).build().unwrap();
    let qkey = 0x1357_2468;
    let init = InitAttr { qkey, ..InitAttr::default() };
    a.ready_ud(&init).unwrap();
    b.ready_ud(&init).unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu.bytes() as usize;
    assert!(mtu >= 256, "active MTU {mtu}");
    let peer = b.local_info(1).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::global(1, peer.gid, gid_index())).unwrap();
    let (mut sq, mut rq) = (a.send_queue::<Chunk>().unwrap(), b.recv_queue::<Chunk>().unwrap());

    for (i, mut c) in chunks(&pd, 4, GRH + mtu, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        c.fill(UNTOUCHED);
        posted(rq.post(c, 0..GRH + mtu, i as u64));
    }
    let mut srcs = chunks(&pd, 4, mtu, AccessFlags::LOCAL_WRITE);
    // First a datagram with the wrong Q_Key: it leaves, and the receiver drops it.
    let mut wrong = srcs.pop().unwrap();
    wrong.copy_from_slice(&random_bytes(40, mtu));
    posted(sq.post(SendWr::send_ud(wrong, 0..64, &ah, b.qp_num(), qkey ^ 1)));
    sent_one(&mut sq, &mut cq_a);

    let sizes = [1, 100, mtu];
    let payloads: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| random_bytes(41 + i as u64, n)).collect();
    for (i, (mut src, data)) in srcs.into_iter().zip(&payloads).enumerate() {
        src[..data.len()].copy_from_slice(data);
        let wr = SendWr::send_ud(src, 0..data.len(), &ah, b.qp_num(), qkey).id(i as u64);
        posted(sq.post(if i == 1 { wr.imm(0xabcd) } else { wr }));
    }
    // The queue keeps the address handle alive until the sends complete.
    drop(ah);
    let mut ids = Vec::new();
    while ids.len() < sizes.len() {
        ids.extend(sent(&mut sq, &mut cq_a).into_iter().map(|d| d.id));
    }
    assert_eq!(ids, [0, 1, 2]);

    for (i, data) in payloads.iter().enumerate() {
        let (wc, got) = received(&mut rq, &mut cq_b);
        let n = data.len();
        assert_eq!(got.id, i as u64, "datagrams take the receives in order; the wrong Q_Key took none");
        assert_eq!(got.byte_len as usize, GRH + n, "byte_len counts the GRH");
        assert!(wc.wc_flags().contains(WcFlags::GRH), "{wc:?}");
        assert_eq!(wc.src_qp(), a.qp_num());
        assert_eq!(wc.imm_data(), (i == 1).then_some(0xabcd));
        same(&got.value[GRH..GRH + n], data, &format!("{n}-byte datagram"));
        untouched(&got.value[GRH + n..], "receive buffer past the datagram");
    }
    quiet(&mut cq_b);
    assert_eq!(rq.outstanding(), 1, "the wrong-Q_Key datagram consumed no receive");
}

// ---- 4. SRQ ---------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_srq_feeds_two_qps_and_takes_their_completions_back_in_any_order_but_never_twice() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut scq, mut rcq) = (CompletionQueue::new(&ctx, 64).unwrap(), CompletionQueue::new(&ctx, 64).unwrap());
    let srq = SharedReceiveQueue::new(&pd, 16, 1).unwrap();
    let recv_qp = || QueuePair::builder(&pd, QpType::Rc, &scq, &rcq).max_send_wr(8).srq(&srq).build().unwrap();
    let send_qp = || QueuePair::builder(&pd, QpType::Rc, &scq, &scq).max_send_wr(16).max_recv_wr(1).build().unwrap();
    let (r1, r2, s1, s2) = (recv_qp(), recv_qp(), send_qp(), send_qp());
    let _l1 = connect(&s1, &r1, QpAccess::empty());
    let _l2 = connect(&s2, &r2, QpAccess::empty());
    assert!(r1.recv_queue::<Chunk>().is_err(), "a QP on an SRQ has no receive queue of its own");
    let mut srqq = srq.queue::<Chunk>().unwrap();
    assert!(srq.queue::<Chunk>().is_err(), "an SRQ's posting side has one owner");
    let (mut sq1, mut sq2) = (s1.send_queue::<Chunk>().unwrap(), s2.send_queue::<Chunk>().unwrap());

    for (i, mut c) in chunks(&pd, 6, 512, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        c.fill(UNTOUCHED);
        posted(srqq.post(c, 0..512, 100 + i as u64));
    }
    let msgs = [random_bytes(51, 300), random_bytes(52, 200)];
    let mut send = |sq: &mut SendQueue<Chunk>, msg: &[u8]| {
        let mut c = chunks(&pd, 1, 512, AccessFlags::LOCAL_WRITE).pop().unwrap();
        c[..msg.len()].copy_from_slice(msg);
        posted(sq.post(SendWr::send(c, 0..msg.len())));
        let mut wc = poll_one(&mut scq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        assert_eq!(sq.complete(&mut wc, |_| ()).unwrap(), 1);
    };
    send(&mut sq1, &msgs[0]);
    send(&mut sq2, &msgs[1]);
    let (mut w1, mut w2) = (poll_one(&mut rcq), poll_one(&mut rcq));
    // Out of order: the second completion first.
    let d2 = srqq.complete(&mut w2).unwrap();
    let d1 = srqq.complete(&mut w1).unwrap();
    let mut qps = Vec::new();
    for (wc, d) in [(&w1, &d1), (&w2, &d2)] {
        assert_eq!((wc.status(), d.status), (WcStatus::Success, WcStatus::Success), "{wc:?}");
        let msg = if wc.qp_num() == r1.qp_num() { &msgs[0] } else { &msgs[1] };
        qps.push(wc.qp_num());
        assert_eq!(d.byte_len as usize, msg.len());
        same(&d.value[..msg.len()], msg, &format!("message to QP {:#x}", wc.qp_num()));
        untouched(&d.value[msg.len()..], "SRQ buffer past the message");
    }
    qps.sort();
    let mut want = vec![r1.qp_num(), r2.qp_num()];
    want.sort();
    assert_eq!(qps, want, "both QPs received through the SRQ");
    let mut ids = vec![d1.id, d2.id];
    ids.sort();
    assert_eq!(ids, [100, 101], "the first two posted receives were taken");
    assert_eq!(srqq.outstanding(), 4);

    // Taken once: the same completions again are refused, also after their slots are
    // reused by new receives.
    assert!(srqq.complete(&mut w1).is_err() && srqq.complete(&mut w2).is_err());
    for (d, id) in [(d1, 200), (d2, 201)] {
        let mut c = d.value;
        c.fill(UNTOUCHED);
        posted(srqq.post(c, 0..512, id));
    }
    assert!(srqq.complete(&mut w1).is_err() && srqq.complete(&mut w2).is_err(), "a stale completion of a reused slot");
    assert_eq!(srqq.outstanding(), 6);

    // The pool is shared: one QP may take more than "its half". Five more messages on s2.
    let round2: Vec<Vec<u8>> = (0..5).map(|i| random_bytes(60 + i, 64 + i as usize)).collect();
    for m in &round2 {
        send(&mut sq2, m);
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        let mut wc = poll_one(&mut rcq);
        assert_eq!((wc.status(), wc.qp_num()), (WcStatus::Success, r2.qp_num()), "{wc:?}");
        let d = srqq.complete(&mut wc).unwrap();
        got.push((d.id, d.value[..d.byte_len as usize].to_vec()));
    }
    assert_eq!(got.iter().map(|g| g.1.clone()).collect::<Vec<_>>(), round2, "in order, byte exact");
    assert_eq!(srqq.outstanding(), 1);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_srq_queue_refuses_a_receive_completion_of_a_qp_on_another_srq() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut scq, mut rcq) = (CompletionQueue::new(&ctx, 64).unwrap(), CompletionQueue::new(&ctx, 64).unwrap());
    let (srq_a, srq_b) = (SharedReceiveQueue::new(&pd, 8, 1).unwrap(), SharedReceiveQueue::new(&pd, 8, 1).unwrap());
    let ra = QueuePair::builder(&pd, QpType::Rc, &scq, &rcq).max_send_wr(8).srq(&srq_a).build().unwrap();
    let _rb = QueuePair::builder(&pd, QpType::Rc, &scq, &rcq).max_send_wr(8).srq(&srq_b).build().unwrap();
    let sa = QueuePair::builder(&pd, QpType::Rc, &scq, &scq).max_send_wr(16).max_recv_wr(1).build().unwrap();
    let _link = connect(&sa, &ra, QpAccess::empty());
    let (mut qa, mut qb) = (srq_a.queue::<Chunk>().unwrap(), srq_b.queue::<Chunk>().unwrap());
    let mut bufs = chunks(&pd, 3, 256, AccessFlags::LOCAL_WRITE);
    for b in &mut bufs {
        b.fill(UNTOUCHED);
    }
    posted(qa.post(bufs.pop().unwrap(), 0..256, 1));
    posted(qb.post(bufs.pop().unwrap(), 0..256, 2));
    let mut sq = sa.send_queue::<Chunk>().unwrap();
    let mut src = bufs.pop().unwrap();
    let msg = random_bytes(70, 128);
    src[..128].copy_from_slice(&msg);
    posted(sq.post(SendWr::send(src, 0..128)));
    sent_one(&mut sq, &mut scq);
    let mut wc = poll_one(&mut rcq);
    assert_eq!((wc.status(), wc.qp_num()), (WcStatus::Success, ra.qp_num()), "{wc:?}");

    // Routed to the wrong SRQ's queue by mistake: SRQ B's receive is still posted, so its
    // buffer must not come back.
    if let Ok(d) = qb.complete(&mut wc) {
        panic!(
            "SRQ B's queue took a completion of QP {:#x} (on SRQ A) and handed back buffer id {} while its \
             receive is still posted (it does not hold the message: {})",
            wc.qp_num(),
            d.id,
            d.value[..128] != msg[..]
        );
    }
    assert_eq!(qb.outstanding(), 1);
    let d = qa.complete(&mut wc).unwrap();
    same(&d.value[..128], &msg, "message through SRQ A");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_receive_queue_claimed_again_refuses_the_completion_of_a_receive_its_predecessor_posted() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let Side { cq: mut b_cq, sq: b_sq, rq: b_rq, qp: b_qp, link: _link } = b;
    let mut rq1 = b_rq;
    let mut bufs = chunks(&pd, 4, 256, AccessFlags::LOCAL_WRITE);
    for c in &mut bufs {
        c.fill(UNTOUCHED);
    }
    posted(rq1.post(bufs.pop().unwrap(), 0..256, 1));
    // The first queue goes with its receive posted (the QP keeps the buffer); a second
    // queue posts behind it.
    drop(rq1);
    let mut rq2 = b_qp.recv_queue::<Chunk>().unwrap();
    posted(rq2.post(bufs.pop().unwrap(), 0..256, 2));

    let msgs = [random_bytes(80, 100), random_bytes(81, 90)];
    let mut send = |msg: &[u8], mut src: Chunk| {
        src[..msg.len()].copy_from_slice(msg);
        posted(a.sq.post(SendWr::send(src, 0..msg.len())));
        sent_one(&mut a.sq, &mut a.cq);
    };
    send(&msgs[0], bufs.pop().unwrap());
    // The first message lands in the predecessor's buffer: not rq2's to take.
    let mut wc = poll_one(&mut b_cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    if let Ok(d) = rq2.complete(&mut wc) {
        panic!(
            "the second receive queue took the completion of its predecessor's receive and handed back buffer \
             id {} while it is still posted (it holds the message: {})",
            d.id,
            d.value[..100] == msgs[0][..]
        );
    }
    assert_eq!(rq2.outstanding(), 1);
    // The second message is rq2's.
    send(&msgs[1], bufs.pop().unwrap());
    let (_, d) = received(&mut rq2, &mut b_cq);
    assert_eq!((d.id, d.byte_len), (2, 90));
    same(&d.value[..90], &msgs[1], "second queue's receive");
    drop((b_sq, b_qp));
}

// ---- 5. threads -----------------------------------------------------------------

/// Message `i` of a stream: its number, then bytes that depend on it.
fn message(seed: u64, i: u64, len: usize) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.extend(random_bytes(seed * 1_000_003 + i, len - 8));
    m
}

const STREAM_LEN: usize = 256;
const STREAM_N: u64 = 200;

/// Sends STREAM_N messages, posting only against credits the receiver granted, and
/// reclaims the buffers from its own CQ. Returns them.
fn stream_sender(
    mut sq: SendQueue<Chunk>,
    mut cq: CompletionQueue,
    mut pool: Vec<Chunk>,
    credits: mpsc::Receiver<usize>,
    seed: u64,
) -> Vec<Chunk> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut credit, mut next, mut done) = (0usize, 0u64, 0u64);
    let mut wcs = [WorkCompletion::EMPTY; 16];
    while done < STREAM_N {
        while let Ok(n) = credits.try_recv() {
            credit += n;
        }
        if next < STREAM_N && credit > 0 {
            if let Some(mut c) = pool.pop() {
                c[..STREAM_LEN].copy_from_slice(&message(seed, next, STREAM_LEN));
                posted(sq.post(SendWr::send(c, 0..STREAM_LEN).id(next)));
                (next, credit) = (next + 1, credit - 1);
                continue;
            }
        }
        let polled = cq.poll(&mut wcs).unwrap();
        if polled.is_empty() {
            assert!(Instant::now() < deadline, "sender {seed}: {done} of {STREAM_N} sent ({next} posted)");
            std::thread::yield_now();
        }
        for wc in polled.iter_mut() {
            assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
            sq.complete(wc, |d| {
                assert_eq!(d.id, done, "send completions in posting order");
                done += 1;
                pool.push(d.value);
            })
            .unwrap();
        }
    }
    pool
}

/// Receives STREAM_N messages in order, reposting buffers and granting a credit for each.
fn stream_receiver(
    mut rq: RecvQueue<Chunk>,
    mut cq: CompletionQueue,
    pool: Vec<Chunk>,
    credits: mpsc::Sender<usize>,
    seed: u64,
) -> Vec<Chunk> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let n = pool.len();
    for (i, c) in pool.into_iter().enumerate() {
        posted(rq.post(c, 0..STREAM_LEN, i as u64));
    }
    credits.send(n).unwrap();
    let (mut got, mut kept) = (0u64, Vec::new());
    let mut wcs = [WorkCompletion::EMPTY; 16];
    while got < STREAM_N {
        let polled = cq.poll(&mut wcs).unwrap();
        if polled.is_empty() {
            assert!(Instant::now() < deadline, "receiver {seed}: {got} of {STREAM_N} received");
            std::thread::yield_now();
        }
        for wc in polled.iter_mut() {
            let d = rq.complete(wc).unwrap();
            assert_eq!((d.status, d.byte_len as usize), (WcStatus::Success, STREAM_LEN), "{wc:?}");
            same(&d.value[..STREAM_LEN], &message(seed, got, STREAM_LEN), &format!("message {got} of stream {seed}"));
            got += 1;
            if got + (rq.outstanding() as u64) < STREAM_N {
                posted(rq.post(d.value, 0..STREAM_LEN, got));
                // The sender may have finished only once everything it will send arrived.
                let _ = credits.send(1);
            } else {
                kept.push(d.value);
            }
        }
    }
    kept
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn each_side_of_two_qps_runs_on_its_own_thread_and_two_streams_arrive_in_order() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (a, b) = connected::<Chunk, Chunk>(&pd, QpAccess::empty(), false, |q| q.max_send_wr(32).max_recv_wr(32));
    let End { sq: a_sq, rq: a_rq, scq: a_scq, rcq: a_rcq, qp: a_qp, _link } = a;
    let End { sq: b_sq, rq: b_rq, scq: b_scq, rcq: b_rcq, qp: b_qp, .. } = b;
    let pool = || chunks(&pd, 16, STREAM_LEN, AccessFlags::LOCAL_WRITE);
    let (to_a, credits_a) = mpsc::channel();
    let (to_b, credits_b) = mpsc::channel();
    let start = Instant::now();
    // Four threads: A's send side and A's receive side run at the same time, as do B's.
    let returned = std::thread::scope(|s| {
        let handles = [
            s.spawn({
                let p = pool();
                move || stream_sender(a_sq, a_scq, p, credits_a, 1)
            }),
            s.spawn({
                let p = pool();
                move || stream_receiver(b_rq, b_rcq, p, to_a, 1)
            }),
            s.spawn({
                let p = pool();
                move || stream_sender(b_sq, b_scq, p, credits_b, 2)
            }),
            s.spawn({
                let p = pool();
                move || stream_receiver(a_rq, a_rcq, p, to_b, 2)
            }),
        ];
        handles.map(|h| h.join().unwrap())
    });
    eprintln!("2 x {STREAM_N} messages on four threads in {:?}", start.elapsed());
    let [sent_a, recv_b, sent_b, recv_a] = returned.map(|v| v.len());
    assert_eq!((sent_a, sent_b), (16, 16), "every send buffer came back");
    assert_eq!((recv_a, recv_b), (16, 16), "every receive buffer came back");
    drop((a_qp, b_qp));
}

// ---- 6. completion channel --------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn arm_drain_wait_ack_rearm_receives_every_spaced_message_without_a_lost_wakeup() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (a, b) = connected::<Chunk, Chunk>(&pd, QpAccess::empty(), true, |q| q);
    let End { sq: mut a_sq, scq: mut a_scq, .. } = a;
    let End { rq: mut b_rq, rcq: mut b_rcq, .. } = b;
    const K: u64 = 8;
    let spacing = Duration::from_millis(40);
    for (i, c) in chunks(&pd, K as usize, 128, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        posted(b_rq.post(c, 0..128, i as u64));
    }
    let srcs = chunks(&pd, K as usize, 128, AccessFlags::LOCAL_WRITE);
    let start = Instant::now();
    let (mut got, mut wakeups) = (0u64, 0u32);
    std::thread::scope(|s| {
        s.spawn(|| {
            for (i, mut c) in srcs.into_iter().enumerate() {
                std::thread::sleep(spacing);
                c.copy_from_slice(&message(3, i as u64, 128));
                posted(a_sq.post(SendWr::send(c, 0..128)));
                sent_one(&mut a_sq, &mut a_scq);
            }
        });
        b_rcq.arm(false).unwrap();
        loop {
            // Drain after arming: what completed before the arm raises no event.
            while let Some(mut wc) = b_rcq.poll_one().unwrap() {
                let d = b_rq.complete(&mut wc).unwrap();
                assert_eq!(d.status, WcStatus::Success, "{wc:?}");
                same(&d.value[..], &message(3, got, 128), &format!("message {got}"));
                got += 1;
            }
            if got == K {
                break;
            }
            if let Err(e) = b_rcq.wait(Some(Duration::from_secs(10))) {
                panic!("lost wake-up: {got} of {K} messages after {:?}: {e}", start.elapsed());
            }
            wakeups += 1;
            b_rcq.ack_events();
            b_rcq.arm(false).unwrap();
        }
    });
    let took = start.elapsed();
    eprintln!("{K} messages, {wakeups} wake-ups, {took:?}");
    assert!((1..=K as u32).contains(&wakeups), "{wakeups} wake-ups for {K} messages");
    assert!(took < spacing * K as u32 + Duration::from_secs(20), "took {took:?}");
    assert_eq!(b_rcq.unacked_events(), 0);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn wait_times_out_when_nothing_completes_and_wakes_for_the_next_completion() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, mut b) = connected::<Chunk, Chunk>(&pd, QpAccess::empty(), true, |q| q);
    b.rcq.arm(false).unwrap();
    assert!(b.rcq.poll_one().unwrap().is_none());
    let t0 = Instant::now();
    match b.rcq.wait(Some(Duration::from_millis(200))) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(!b.rcq.try_wait().unwrap(), "no event pending");

    // Still armed: the next completion wakes it.
    let mut bufs = chunks(&pd, 2, 64, AccessFlags::LOCAL_WRITE);
    posted(b.rq.post(bufs.pop().unwrap(), 0..64, 0));
    posted(a.sq.post(SendWr::send(bufs.pop().unwrap(), 0..64)));
    b.rcq.wait(Some(Duration::from_secs(10))).unwrap();
    b.rcq.ack_events();
    let (_, d) = received(&mut b.rq, &mut b.rcq);
    assert_eq!(d.byte_len, 64);
    sent_one(&mut a.sq, &mut a.scq);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_cq_armed_for_solicited_events_sleeps_through_a_plain_send_and_wakes_for_a_solicited_one() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, mut b) = connected::<Chunk, Chunk>(&pd, QpAccess::empty(), true, |q| q);
    for (i, c) in chunks(&pd, 2, 64, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        posted(b.rq.post(c, 0..64, i as u64));
    }
    let mut srcs = chunks(&pd, 2, 64, AccessFlags::LOCAL_WRITE);
    b.rcq.arm(true).unwrap();
    // A plain SEND: it completes (the sender's completion comes after the receiver's ack),
    // but raises no solicited event.
    posted(a.sq.post(SendWr::send(srcs.pop().unwrap(), 0..10)));
    sent_one(&mut a.sq, &mut a.scq);
    match b.rcq.wait(Some(Duration::from_millis(300))) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a plain SEND woke a CQ armed for solicited events: {other:?}"),
    }
    posted(a.sq.post(SendWr::send(srcs.pop().unwrap(), 0..20).solicited()));
    b.rcq.wait(Some(Duration::from_secs(10))).unwrap();
    b.rcq.ack_events();
    let lens: Vec<u32> = (0..2).map(|_| received(&mut b.rq, &mut b.rcq).1.byte_len).collect();
    assert_eq!(lens, [10, 20]);
    sent_one(&mut a.sq, &mut a.scq);
}

// ---- 7. inline ------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn inline_sends_up_to_max_inline_data_arrive_and_one_byte_more_is_refused_before_c() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, mut b) = connected::<Chunk, Chunk>(&pd, QpAccess::empty(), false, |q| q.max_inline_data(64));
    let max = a.qp.caps().max_inline_data as usize;
    assert!(max >= 64, "asked for 64 bytes of inline data, granted {max}");
    let mut srcs = chunks(&pd, 4, max + 64, AccessFlags::LOCAL_WRITE);
    let mut dsts = chunks(&pd, 3, max + 64, AccessFlags::LOCAL_WRITE);

    for (i, n) in [1, max].into_iter().enumerate() {
        let data = random_bytes(90 + i as u64, n);
        let mut src = srcs.pop().unwrap();
        src[..n].copy_from_slice(&data);
        let mut dst = dsts.pop().unwrap();
        dst.fill(UNTOUCHED);
        posted(b.rq.post(dst, 0..max + 64, i as u64));
        posted(a.sq.post(SendWr::send(src, 0..n).inline()));
        sent_one(&mut a.sq, &mut a.scq);
        let (_, got) = received(&mut b.rq, &mut b.rcq);
        assert_eq!(got.byte_len as usize, n);
        same(&got.value[..n], &data, &format!("{n} bytes inline"));
        untouched(&got.value[n..], "receive buffer past the inline data");
    }

    // One byte above the limit: refused with the limit named, nothing posted.
    let mut dst = dsts.pop().unwrap();
    dst.fill(UNTOUCHED);
    posted(b.rq.post(dst, 0..max + 64, 9));
    let text = match a.sq.post(SendWr::send(srcs.pop().unwrap(), 0..max + 1).inline()) {
        Err(Refused { error: e, value: _wr }) => invalid_text(&e, "SendQueue::post"),
        Ok(()) => panic!("{} bytes inline posted on a QP with max_inline_data {max}", max + 1),
    };
    assert!(text.contains("max_inline_data") && text.contains(&max.to_string()), "{text}");
    assert_eq!(a.sq.outstanding(), 0);
    quiet(&mut b.rcq);
    // The queue still works: the same size without inline goes through.
    let data = random_bytes(99, max + 1);
    let mut src = srcs.pop().unwrap();
    src[..max + 1].copy_from_slice(&data);
    posted(a.sq.post(SendWr::send(src, 0..max + 1)));
    sent_one(&mut a.sq, &mut a.scq);
    let (_, got) = received(&mut b.rq, &mut b.rcq);
    same(&got.value[..max + 1], &data, "the send after the refusal");
}

// ---- 8. refusals ----------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn out_of_range_posts_are_refused_before_c_and_the_queues_stay_usable() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::REMOTE_READ | QpAccess::REMOTE_WRITE);
    let mut t = target(&pd, 8192);
    let tdata = random_bytes(110, 8192);
    t.write_at(0, &tdata).unwrap();
    let remote = t.remote().unwrap();
    let mut bufs = chunks(&pd, 5, 4096, AccessFlags::LOCAL_WRITE);

    // RDMA READ into a range past the chunk's end, or starting past it, or longer than
    // the remote region: each refused before C, naming the problem.
    let bad = [(0..4097, remote, "4096"), (5000..5000, remote, "4096")];
    for (range, r, what) in bad.into_iter().chain([(0..4096, remote.slice(..100).unwrap(), "100 bytes")]) {
        let text = match a.sq.post(SendWr::read(bufs.pop().unwrap(), range.clone(), r)) {
            Err(Refused { error: e, value: _wr }) => invalid_text(&e, "SendQueue::post"),
            Ok(()) => panic!("READ into {range:?} posted"),
        };
        assert!(text.contains(what), "READ into {range:?}: {text}");
        assert_eq!(a.sq.outstanding(), 0, "nothing posted");
    }
    // The queue still works: a good READ brings the remote bytes.
    posted(a.sq.post(SendWr::read(bufs.pop().unwrap(), 0..4096, remote.slice(4096..).unwrap())));
    let d = sent_one(&mut a.sq, &mut a.cq);
    same(&d.value, &tdata[4096..], "READ after the refusals");

    // A receive past its chunk's end: refused, and the very buffer comes back in the error.
    let mut c = bufs.pop().unwrap();
    c.fill(UNTOUCHED);
    let addr = c.addr();
    let c = match b.rq.post(c, 0..4097, 7) {
        Err(Refused { error: e, value: c }) => {
            assert!(invalid_text(&e, "RecvQueue::post").contains("4096"), "{e}");
            c
        }
        Ok(()) => panic!("receive into 0..4097 of a 4096-byte chunk posted"),
    };
    assert_eq!((c.addr(), b.rq.outstanding()), (addr, 0));
    posted(b.rq.post(c, 0..4096, 7));
    let msg = random_bytes(111, 3000);
    let mut src = d.value;
    src[..3000].copy_from_slice(&msg);
    posted(a.sq.post(SendWr::send(src, 0..3000)));
    sent_one(&mut a.sq, &mut a.cq);
    let mut wc = poll_one(&mut b.cq);
    let got = b.rq.complete(&mut wc).unwrap();
    assert_eq!((got.id, got.status, got.byte_len), (7, WcStatus::Success, 3000));
    same(&got.value[..3000], &msg, "receive into the returned buffer");
    untouched(&got.value[3000..], "returned buffer past the message");

    // A shared source refused for its range comes back too: the clone is dropped with the
    // refused request, and none is kept.
    drop(a.sq);
    let mut shared_sq = a.qp.send_queue::<Arc<Chunk>>().unwrap();
    let shared = Arc::new(got.value);
    match shared_sq.post(SendWr::write(Arc::clone(&shared), 0..4097, remote)) {
        Err(Refused { error: e, value: wr }) => {
            assert!(invalid_text(&e, "SendQueue::post").contains("4096"), "{e}");
            assert_eq!(Arc::strong_count(&shared), 2, "the refused request holds the clone");
            drop(wr);
        }
        Ok(()) => panic!("WRITE of 0..4097 of a 4096-byte chunk posted"),
    }
    assert_eq!(Arc::strong_count(&shared), 1, "nothing kept by the queue");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn reversed_ranges_are_refused_before_c_for_receive_send_and_read() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::REMOTE_READ);
    let t = target(&pd, 4096);
    let mut bufs = chunks(&pd, 3, 4096, AccessFlags::LOCAL_WRITE);
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 10..5;
    match b.rq.post(bufs.pop().unwrap(), reversed.clone(), 1) {
        Err(Refused { error: e, value: _c }) => assert!(invalid_text(&e, "RecvQueue::post").contains("10..5"), "{e}"),
        Ok(()) => panic!("a receive into 10..5 of a chunk was posted (as a zero-length receive)"),
    }
    let wrs = [
        SendWr::send(bufs.pop().unwrap(), reversed.clone()),
        SendWr::read(bufs.pop().unwrap(), reversed, t.remote().unwrap()),
    ];
    for (wr, what) in wrs.into_iter().zip(["SEND", "READ"]) {
        match a.sq.post(wr) {
            Err(Refused { error: e, .. }) => {
                assert!(invalid_text(&e, "SendQueue::post").contains("10..5"), "{what}: {e}")
            }
            Ok(()) => panic!("a {what} of 10..5 of a chunk was posted"),
        }
    }
    assert_eq!(a.sq.outstanding() + b.rq.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn full_queues_refuse_before_c_and_take_the_refused_work_once_completions_free_a_slot() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);

    // Receive side: exactly as many receives as the QP was built for fit (its queue's
    // depth: the max_recv_wr asked; rxe from Linux 6.2 grants more, and caps() says so).
    let granted = (b.qp.caps().max_recv_wr, b.qp.caps().max_send_wr);
    eprintln!("asked {PAIR_DEPTH} each way, granted (recv, send) {granted:?}");
    assert!(granted.0 >= PAIR_DEPTH && granted.1 >= PAIR_DEPTH, "{granted:?}");
    let depth = PAIR_DEPTH as usize;
    let mut bufs = chunks(&pd, depth + 1, 64, AccessFlags::LOCAL_WRITE);
    for (i, c) in bufs.drain(..depth).enumerate() {
        posted(b.rq.post(c, 0..64, i as u64));
    }
    let extra = bufs.pop().unwrap();
    let extra = match b.rq.post(extra, 0..64, 999) {
        Err(Refused { error: e, value: c }) => {
            assert!(invalid_text(&e, "RecvQueue::post").contains("full"), "{e}");
            c
        }
        Ok(()) => panic!("receive {} posted on a queue of {depth}", depth + 1),
    };
    assert_eq!(b.rq.outstanding(), depth);
    let mut src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    src.copy_from_slice(&random_bytes(120, 64));
    posted(a.sq.post(SendWr::send(src, 0..64)));
    let src = sent_one(&mut a.sq, &mut a.cq).value;
    let (_, first) = received(&mut b.rq, &mut b.cq);
    assert_eq!(first.id, 0);
    posted(b.rq.post(extra, 0..64, 999));
    assert_eq!(b.rq.outstanding(), depth);

    // Send side: max_send_wr unsignaled-but-last WRITEs fill it; one more is refused and
    // comes back; after the one completion releases all of them it posts.
    let depth = PAIR_DEPTH as usize;
    let t = target(&pd, (depth + 1) * 64);
    let remote = t.remote().unwrap();
    let mut srcs = chunks(&pd, depth + 1, 64, AccessFlags::LOCAL_WRITE);
    for (i, s) in srcs.iter_mut().enumerate() {
        s.copy_from_slice(&message(4, i as u64, 64));
    }
    let last = srcs.pop().unwrap();
    for (i, s) in srcs.into_iter().enumerate() {
        let wr = SendWr::write(s, 0..64, remote.slice(i as u64 * 64..).unwrap()).id(i as u64);
        posted(a.sq.post(wr.signaled(i + 1 == depth)));
    }
    let refused = match a.sq.post(SendWr::write(last, 0..64, remote.slice(depth as u64 * 64..).unwrap()).id(999)) {
        Err(Refused { error: e, value: wr }) => {
            assert!(invalid_text(&e, "SendQueue::post").contains("full"), "{e}");
            wr
        }
        Ok(()) => panic!("send {} posted on a queue of {depth}", depth + 1),
    };
    assert_eq!(a.sq.outstanding(), depth);
    let done = sent(&mut a.sq, &mut a.cq);
    assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), (0..depth as u64).collect::<Vec<_>>());
    posted(a.sq.post(refused));
    assert_eq!(sent_one(&mut a.sq, &mut a.cq).id, 999);
    for i in 0..=depth {
        same(&read_back(&t, i * 64, 64), &message(4, i as u64, 64), &format!("WRITE {i}"));
    }
    drop((src, first));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn completions_are_taken_only_by_the_queue_that_posted_them() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut bufs = chunks(&pd, 4, 256, AccessFlags::LOCAL_WRITE);
    let (msg_ab, msg_ba) = (random_bytes(130, 200), random_bytes(131, 150));
    posted(a.rq.post(bufs.pop().unwrap(), 0..256, 10));
    posted(b.rq.post(bufs.pop().unwrap(), 0..256, 20));
    let (mut s1, mut s2) = (bufs.pop().unwrap(), bufs.pop().unwrap());
    s1[..200].copy_from_slice(&msg_ab);
    s2[..150].copy_from_slice(&msg_ba);
    // Both sides have send 0 and receive 0 outstanding: the wr_ids alone match.
    posted(a.sq.post(SendWr::send(s1, 0..200).id(1)));
    posted(b.sq.post(SendWr::send(s2, 0..150).id(2)));
    let take = |cq: &mut CompletionQueue| {
        let (x, y) = (poll_one(cq), poll_one(cq));
        if x.opcode().is_recv() {
            (y, x)
        } else {
            (x, y)
        }
    };
    let (mut a_send, mut a_recv) = take(&mut a.cq);
    let (mut b_send, mut b_recv) = take(&mut b.cq);
    for wc in [&a_send, &a_recv, &b_send, &b_recv] {
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    }

    let refused = |r: Result<usize, Error>, method: &str, what: &str| match r {
        Err(e) => assert!(invalid_text(&e, method).contains("not outstanding"), "{what}: {e}"),
        Ok(n) => panic!("{what}: taken, releasing {n}"),
    };
    let (sq, rq) = ("SendQueue::complete", "RecvQueue::complete");
    refused(b.sq.complete(&mut a_send, |_| ()), sq, "A's send completion on B's send queue");
    refused(a.sq.complete(&mut a_recv, |_| ()), sq, "A's receive completion on A's send queue");
    refused(a.sq.complete(&mut b_send, |_| ()), sq, "B's send completion on A's send queue");
    refused(a.rq.complete(&mut b_recv).map(|_| 1), rq, "B's receive completion on A's receive queue");
    refused(a.rq.complete(&mut a_send).map(|_| 1), rq, "A's send completion on A's receive queue");
    refused(b.rq.complete(&mut a_recv).map(|_| 1), rq, "A's receive completion on B's receive queue");
    assert_eq!([a.sq.outstanding(), a.rq.outstanding(), b.sq.outstanding(), b.rq.outstanding()], [1; 4]);

    // Each is taken by its own queue, once.
    let mut ids = Vec::new();
    a.sq.complete(&mut a_send, |d| ids.push(d.id)).unwrap();
    b.sq.complete(&mut b_send, |d| ids.push(d.id)).unwrap();
    assert_eq!(ids, [1, 2]);
    let (ga, gb) = (a.rq.complete(&mut a_recv).unwrap(), b.rq.complete(&mut b_recv).unwrap());
    assert_eq!((ga.id, gb.id), (10, 20));
    same(&gb.value[..200], &msg_ab, "A to B");
    same(&ga.value[..150], &msg_ba, "B to A");
    refused(a.sq.complete(&mut a_send, |_| ()), sq, "A's send completion again");
    refused(b.rq.complete(&mut b_recv).map(|_| 1), rq, "B's receive completion again");
}

// ---- 9. moderation --------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn signaling_every_16th_of_256_writes_releases_each_run_of_16_in_order() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    const N: u64 = 256;
    const MODERATION: u64 = 16;
    const LEN: usize = 64;
    let t = target(&pd, N as usize * LEN);
    let remote = t.remote().unwrap();
    // perftest's shape: a tx depth of 64 buffers, post while there is room, poll otherwise.
    let mut pool = chunks(&pd, 64, LEN, AccessFlags::LOCAL_WRITE);
    let (mut next, mut released, mut completions) = (0u64, Vec::new(), 0);
    while (released.len() as u64) < N {
        if next < N {
            if let Some(mut c) = pool.pop() {
                c.copy_from_slice(&message(5, next, LEN));
                let signaled = next % MODERATION == MODERATION - 1;
                let wr = SendWr::write(c, 0..LEN, remote.slice(next * LEN as u64..).unwrap()).id(next);
                posted(a.sq.post(wr.signaled(signaled)));
                next += 1;
                continue;
            }
        }
        let before = released.len();
        let mut wc = poll_one(&mut a.cq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        let n = a.sq.complete(&mut wc, |d| {
            assert_eq!(d.status, WcStatus::Success);
            released.push(d.id);
            pool.push(d.value);
        });
        assert_eq!(n.unwrap(), MODERATION as usize, "one completion releases its run");
        assert_eq!(released[before..], (before as u64..before as u64 + MODERATION).collect::<Vec<_>>()[..]);
        completions += 1;
    }
    assert_eq!(completions, N / MODERATION);
    assert_eq!(released, (0..N).collect::<Vec<_>>());
    assert_eq!((a.sq.outstanding(), pool.len()), (0, 64));
    quiet(&mut a.cq);
    for i in 0..N {
        same(&read_back(&t, i as usize * LEN, LEN), &message(5, i, LEN), &format!("WRITE {i}"));
    }
}

// ---- fence ----------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_fenced_write_batched_after_a_read_of_the_same_bytes_lets_the_read_return_the_old_ones() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_READ | QpAccess::REMOTE_WRITE);
    let mut t = target(&pd, 1024);
    let (old, new) = (random_bytes(140, 1024), random_bytes(141, 1024));
    t.write_at(0, &old).unwrap();
    let mut bufs = chunks(&pd, 2, 1024, AccessFlags::LOCAL_WRITE);
    let (mut src, rd) = (bufs.pop().unwrap(), bufs.pop().unwrap());
    src.copy_from_slice(&new);
    let wrs = [
        SendWr::read(rd, 0..1024, t.remote().unwrap()).id(1),
        SendWr::write(src, 0..1024, t.remote().unwrap()).fence().id(2),
    ];
    assert_eq!(a.sq.post_batch(wrs).unwrap(), 2);
    let mut done = Vec::new();
    while done.len() < 2 {
        done.extend(sent(&mut a.sq, &mut a.cq));
    }
    assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), [1, 2]);
    same(&done[0].value, &old, "the READ before the fenced WRITE");
    same(&read_back(&t, 0, 1024), &new, "the target after the WRITE");
}

// ---- flush ----------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_errored_qp_flushes_every_outstanding_send_once_and_reports_none_as_success() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let t = target(&pd, 32 * 64);
    // The peer is reset: nothing it is sent is ever acknowledged.
    b.qp.reset().unwrap();
    for (i, c) in chunks(&pd, 32, 64, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        let wr = SendWr::write(c, 0..64, t.remote().unwrap().slice(i as u64 * 64..).unwrap()).id(i as u64);
        posted(a.sq.post(wr.signaled(i % 8 == 7)));
    }
    a.qp.to_error().unwrap();
    let mut released = Vec::new();
    while released.len() < 32 {
        let mut wc = poll_one(&mut a.cq);
        a.sq.complete(&mut wc, |d| released.push((d.id, d.status))).unwrap();
    }
    assert_eq!(released.iter().map(|r| r.0).collect::<Vec<_>>(), (0..32).collect::<Vec<_>>(), "each once, in order");
    let ok: Vec<u64> = released.iter().filter(|r| r.1 == WcStatus::Success).map(|r| r.0).collect();
    assert!(ok.is_empty(), "flushed writes reported as successful: {ok:?}");
    assert_eq!(a.sq.outstanding(), 0);
    quiet(&mut a.cq);
    untouched(&read_back(&t, 0, 32 * 64), "target of writes that never ran");
}
