//! Two RC QPs of the device under test connected to each other, the way the device's
//! transport allows: by hand (`local_info` and `connect`) on InfiniBand and RoCE, through
//! rdma_cm on iWARP, whose QPs connect no other way (a TCP connection carries them).

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use rdma_verbs::{CmId, ConnParam, EventChannel, InitAttr, PortSpace, QpState, QueuePair, Transport};

use crate::{device_transport, rdma_ip};

const T: Duration = Duration::from_secs(10);

/// What keeps a connection of [`connect_rc`] up: nothing for QPs connected by hand; on
/// iWARP the two rdma_cm ids that carry it (dropping an id ends its connection). Keep it
/// as long as the QPs are used; it may outlive them.
#[must_use = "on iWARP dropping the link ends the connection"]
pub struct Link {
    cm: Option<CmIds>,
}

/// In drop order: the connected ids, then the listener, then the channels.
struct CmIds {
    _client: CmId,
    _server: CmId,
    _listener: CmId,
    _channels: [EventChannel; 2],
}

impl Link {
    /// Whether the QPs were connected through rdma_cm (iWARP).
    pub fn through_rdma_cm(&self) -> bool {
        self.cm.is_some()
    }
}

/// Connects `a` and `b`, RC QPs in RESET on the device under test, to each other. On
/// InfiniBand and RoCE: `connect` with `init`, each towards the other's `local_info`. On
/// iWARP: `b` accepts and `a` connects through rdma_cm (`accept_with`, `connect_with`),
/// each moved to INIT with the CM's attributes (on iWARP the CM grants remote READ and
/// WRITE, whatever `init` asks); the kernel brings both to RTS. Panics on any failure:
/// the tests that use it are about what comes after.
pub fn connect_rc(a: &QueuePair, b: &QueuePair, init: &InitAttr) -> Link {
    if device_transport() != Transport::Iwarp {
        let (ia, ib) = (a.local_info(init.port).unwrap(), b.local_info(init.port).unwrap());
        a.connect(init, &ib).unwrap();
        b.connect(init, &ia).unwrap();
        return Link { cm: None };
    }
    let channels = [EventChannel::new().unwrap(), EventChannel::new().unwrap()];
    let listener = CmId::new(&channels[0], PortSpace::Tcp).unwrap();
    listener.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    listener.listen(1).unwrap();
    let addr = listener.local_addr().expect("a bound listener has its address");
    let (client, server) = thread::scope(|s| {
        let server = s.spawn(|| {
            let id = listener.get_request(T).unwrap().into_id();
            id.modify_qp(b, QpState::Init).unwrap();
            id.accept_with(b, &ConnParam::new(), T).unwrap();
            id
        });
        let client = CmId::new(&channels[1], PortSpace::Tcp).unwrap();
        client.resolve_addr(None, addr, T).unwrap();
        client.resolve_route(T).unwrap();
        client.modify_qp(a, QpState::Init).unwrap();
        client.connect_with(a, &ConnParam::new(), T).unwrap();
        (client, server.join().expect("the accepting side"))
    });
    Link { cm: Some(CmIds { _client: client, _server: server, _listener: listener, _channels: channels }) }
}
