//! The endpoint exchange and status sync on a stream whose peer side is arbitrary bytes:
//! they never panic, never read more than one endpoint and one status (64 bytes) whatever
//! the peer sends, and succeed only when the peer sent a canonical endpoint and "ready".
#![no_main]

use std::io::{self, Read, Write};

use libfuzzer_sys::fuzz_target;
use rdma_verbs::wire::{self, Endpoint, Status, STATUS_LEN};
use rdma_verbs::{Gid, Mtu, QpType};

/// The peer's bytes to read, in pieces of the sizes the input asks for (short reads),
/// and a sink for what this side writes.
struct Peer<'a> {
    data: &'a [u8],
    taken: usize,
    piece: usize,
    written: Vec<u8>,
}

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len() - self.taken);
        buf[..n].copy_from_slice(&self.data[self.taken..self.taken + n]);
        self.taken += n;
        Ok(n)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, data)) = data.split_first() else { return };
    let mine = Endpoint {
        transport: QpType::Rc,
        qpn: 0x1234,
        psn: 0x42,
        qkey: 0,
        lid: 0,
        gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1]),
        mtu: Mtu::Mtu1024,
        mr: None,
    };
    let mut peer = Peer { data, taken: 0, piece: usize::from(piece.max(1)), written: Vec::new() };
    let got = wire::exchange(&mut peer, &mine).and_then(|ep| wire::sync(&mut peer, Status::Ready).map(|()| ep));
    assert!(peer.taken <= Endpoint::WIRE_LEN + STATUS_LEN, "read {} bytes", peer.taken);
    assert_eq!(&peer.written[..Endpoint::WIRE_LEN], &mine.to_bytes()[..], "this side speaks first");
    if let Ok(ep) = got {
        assert_eq!(peer.taken, Endpoint::WIRE_LEN + STATUS_LEN);
        assert_eq!(&data[..Endpoint::WIRE_LEN], &ep.to_bytes()[..]);
        assert_eq!(&data[Endpoint::WIRE_LEN..peer.taken], &Status::Ready.to_bytes()[..]);
    }
});
