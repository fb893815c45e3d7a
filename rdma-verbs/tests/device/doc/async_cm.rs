use std::net::SocketAddr;
use std::time::Duration;

use rdma_verbs::{
    AsyncCmId, CmId, CompletionQueue, ConnParam, EventChannel, PortSpace, ProtectionDomain, QpType, QueuePair,
};

/// The QP of a connection's id: made before connecting or accepting.
fn make_qp(id: &CmId) -> rdma_verbs::Result<QueuePair> {
    let ctx = id.context()?;
    let (pd, cq) = (ProtectionDomain::new(&ctx)?, CompletionQueue::new(&ctx, 16)?);
    id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4))
}

fn main() -> rdma_verbs::Result<()> {
    const T: Duration = Duration::from_secs(10);
    // rdma_cm needs the IP of a netdev under the RDMA device (scripts/rxe exports RDMA_IP).
    let ip = std::env::var("RDMA_IP").expect("RDMA_IP").parse().expect("an IP address");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    rt.block_on(async {
        let listener = CmId::new(&EventChannel::new()?, PortSpace::Tcp)?;
        let mut listener = AsyncCmId::tokio(listener)?;
        listener.id().bind(SocketAddr::new(ip, 0))?;
        listener.id().listen(8)?;
        let addr = listener.id().local_addr().expect("bound");

        // The server: an accept loop, each connection served in a task of its own.
        let server = tokio::spawn(async move {
            let mut served = Vec::new();
            for _ in 0..2 {
                let request = listener.get_request(T).await?;
                served.push(tokio::spawn(async move {
                    // Its own channel: this task awaits only this connection's events.
                    let mut id = AsyncCmId::tokio(request.into_id())?;
                    let _qp = make_qp(id.id())?;
                    id.accept(&ConnParam::new(), T).await?;
                    // Until the client hangs up (its DISCONNECTED is here then).
                    id.disconnect(T).await
                }));
            }
            for task in served {
                task.await.expect("the task ran")?;
            }
            rdma_verbs::Result::Ok(())
        });

        // Two clients, one after the other.
        for _ in 0..2 {
            let mut id = AsyncCmId::tokio(CmId::new(&EventChannel::new()?, PortSpace::Tcp)?)?;
            id.resolve_addr(None, addr, T).await?;
            id.resolve_route(T).await?;
            let _qp = make_qp(id.id())?;
            let established = id.connect(&ConnParam::new(), T).await?;
            println!("connected to {addr}: the server's QP is {:?}", established.conn().map(|c| c.qp_num));
            id.disconnect(T).await?;
        }
        server.await.expect("the server ran")
    })
}
