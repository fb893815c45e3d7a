//! One error type for the whole crate, at the bottom of it: nothing here names a module
//! above (see `docs/architecture.md`).
//!
//! Every error names the [`Verb`] that failed, a C call or the method of ours that checks
//! arguments before one. Errors from C carry the errno as a [`std::io::Error`], say which
//! plane of the RDMA stack they came from, and, where the usual cause is known, give a
//! one-line hint. A value that a call did not take comes back with its error in a
//! [`Refused`].

use std::borrow::Cow;
use std::fmt;
use std::io;
use std::time::Duration;

use crate::codes::{QpType, WcOpcode, WcStatus};

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which path through the RDMA stack a verb takes: the first question when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// Opening devices, creating and modifying objects, connecting: libibverbs, then a
    /// system call into the kernel (ib_uverbs, the driver, possibly the firmware).
    Control,
    /// Posting work requests and polling completions: the user-space provider
    /// (libmlx5, librxe, ...) and the hardware queues, with no kernel in between.
    Data,
}

impl fmt::Display for Plane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Plane::Control => "control plane: libibverbs -> kernel driver",
            Plane::Data => "data plane: user-space provider -> hardware queues",
        })
    }
}

macro_rules! verbs {
    ($($(#[$m:meta])* $v:ident = $name:literal, $plane:ident;)*) => {
        /// What failed: a C call of libibverbs or librdmacm, or the method of this crate that
        /// checks arguments before one. Its [`Display`](fmt::Display) is the C name (or the
        /// method's path); the hints of [`Error`] are chosen per variant, so the compiler
        /// checks every one of them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Verb {
            $($(#[$m])* #[doc = concat!("`", $name, "`")] $v,)*
        }

        impl Verb {
            /// The C function's name, or the method's path.
            pub const fn name(self) -> &'static str {
                match self { $(Verb::$v => $name,)* }
            }

            /// The plane of the RDMA stack this call takes.
            pub const fn plane(self) -> Plane {
                match self { $(Verb::$v => Plane::$plane,)* }
            }
        }
    };
}

verbs! {
    GetDeviceList = "ibv_get_device_list", Control;
    OpenDevice = "ibv_open_device", Control;
    CloseDevice = "ibv_close_device", Control;
    QueryDevice = "ibv_query_device", Control;
    QueryPort = "ibv_query_port", Control;
    QueryGidTable = "ibv_query_gid_table", Control;
    QueryGidEx = "ibv_query_gid_ex", Control;
    AllocPd = "ibv_alloc_pd", Control;
    DeallocPd = "ibv_dealloc_pd", Control;
    RegMr = "ibv_reg_mr", Control;
    RegMrIova2 = "ibv_reg_mr_iova2", Control;
    DeregMr = "ibv_dereg_mr", Control;
    CreateCompChannel = "ibv_create_comp_channel", Control;
    DestroyCompChannel = "ibv_destroy_comp_channel", Control;
    CreateCq = "ibv_create_cq", Control;
    CreateCqEx = "ibv_create_cq_ex", Control;
    DestroyCq = "ibv_destroy_cq", Control;
    ReqNotifyCq = "ibv_req_notify_cq", Control;
    GetCqEvent = "ibv_get_cq_event", Control;
    CreateQp = "ibv_create_qp", Control;
    CreateQpEx = "ibv_create_qp_ex", Control;
    QpToQpEx = "ibv_qp_to_qp_ex", Control;
    ModifyQp = "ibv_modify_qp", Control;
    QueryQp = "ibv_query_qp", Control;
    DestroyQp = "ibv_destroy_qp", Control;
    CreateSrq = "ibv_create_srq", Control;
    ModifySrq = "ibv_modify_srq", Control;
    QuerySrq = "ibv_query_srq", Control;
    DestroySrq = "ibv_destroy_srq", Control;
    CreateAh = "ibv_create_ah", Control;
    /// [`AddressHandle::new`](crate::AddressHandle::new) (also under
    /// [`AddressHandle::from_completion`](crate::AddressHandle::from_completion)), refusing
    /// before `ibv_create_ah` when the device has no address handles.
    AhNew = "AddressHandle::new", Control;
    DestroyAh = "ibv_destroy_ah", Control;
    GetAsyncEvent = "ibv_get_async_event", Control;
    PostSend = "ibv_post_send", Data;
    PostRecv = "ibv_post_recv", Data;
    PostSrqRecv = "ibv_post_srq_recv", Data;
    PollCq = "ibv_poll_cq", Data;
    StartPoll = "ibv_start_poll", Data;
    NextPoll = "ibv_next_poll", Data;
    WrStart = "ibv_wr_start", Data;
    CreateEventChannel = "rdma_create_event_channel", Control;
    GetCmEvent = "rdma_get_cm_event", Control;
    CreateId = "rdma_create_id", Control;
    DestroyId = "rdma_destroy_id", Control;
    BindAddr = "rdma_bind_addr", Control;
    Listen = "rdma_listen", Control;
    ResolveAddr = "rdma_resolve_addr", Control;
    ResolveRoute = "rdma_resolve_route", Control;
    CmCreateQp = "rdma_create_qp_ex", Control;
    Connect = "rdma_connect", Control;
    Accept = "rdma_accept", Control;
    Reject = "rdma_reject", Control;
    Disconnect = "rdma_disconnect", Control;
    MigrateId = "rdma_migrate_id", Control;
    JoinMulticast = "rdma_join_multicast", Control;
    LeaveMulticast = "rdma_leave_multicast", Control;
    /// Reading the file descriptor flags of a channel.
    GetFl = "fcntl(F_GETFL)", Control;
    /// Making a channel's file descriptor non-blocking.
    SetFl = "fcntl(F_SETFL)", Control;
    /// Waiting on a channel's file descriptor.
    Poll = "poll", Control;
    /// Making the timer that bounds an async wait.
    TimerfdCreate = "timerfd_create", Control;
    /// Arming the timer that bounds an async wait.
    TimerfdSettime = "timerfd_settime", Control;
    /// Reading the timer that bounds an async wait.
    TimerfdRead = "read(timerfd)", Control;
    /// Claiming a queue of a QP or SRQ ([`crate::QueuePair::send_queue`] and friends).
    Claim = "claiming a queue", Data;
    /// Awaiting a request's completion ([`crate::AsyncSendQueue`], [`crate::AsyncRecvQueue`]).
    Await = "awaiting a completion", Data;
    /// Allocating page-aligned memory.
    AlignedBufNew = "AlignedBuf::new", Control;
    /// Cutting a region into chunks.
    IntoChunks = "MemoryRegion::into_chunks", Control;
    /// Building a scatter/gather entry of a region.
    MrSge = "MemoryRegion::sge", Data;
    /// Building a scatter/gather entry of a chunk.
    ChunkSge = "Chunk::sge", Data;
    /// Polling a CQ's extended completions.
    PollExtended = "CompletionQueue::poll_extended", Data;
    /// Asking whether a QP writes an operation's data in order.
    QpDataInOrder = "QueuePair::data_in_order", Control;
    /// An atomic view of 8 bytes of a region.
    MrAtomicU64 = "MemoryRegion::atomic_u64", Data;
    /// Copying bytes into a region.
    MrWriteAt = "MemoryRegion::write_at", Data;
    /// Copying bytes out of a region.
    MrReadAt = "MemoryRegion::read_at", Data;
    /// Converting an address to the C struct.
    AhAttrToFfi = "AhAttr::to_ffi", Control;
    /// Handing out a remote descriptor of a region.
    MrRemote = "MemoryRegion::remote", Control;
    /// A part of a remote region.
    RemoteSlice = "RemoteMr::slice", Data;
    /// Decoding a remote region a peer sent.
    RemoteFromBytes = "RemoteMr::from_bytes", Control;
    /// The file descriptor of a CQ's completion channel.
    CqFd = "CompletionQueue::as_raw_fd", Control;
    /// The device context of a CM id.
    CmContext = "CmId::context", Control;
    /// The endpoint exchange over a byte stream ([`crate::Handshake`]).
    Handshake = "endpoint handshake", Control;
    /// What a peer needs to connect to a QP by hand ([`crate::QueuePair::local_info`]).
    QpLocalInfo = "QueuePair::local_info", Control;
    /// [`SendQueue::post`](crate::SendQueue::post) (of any request kind), refusing a request
    /// before `ibv_post_send`: it was not posted.
    SendQueuePost = "SendQueue::post", Data;
    /// [`SendQueue::post_batch`](crate::SendQueue::post_batch), refusing a request before
    /// `ibv_post_send`: it and every request after it were not posted.
    SendQueuePostBatch = "SendQueue::post_batch", Data;
    /// [`SendQueue::prepare`](crate::SendQueue::prepare), refusing a request to prepare.
    SendQueuePrepare = "SendQueue::prepare", Data;
    /// [`SendQueue::prepare_chain`](crate::SendQueue::prepare_chain), refusing a chain.
    SendQueuePrepareChain = "SendQueue::prepare_chain", Data;
    /// [`PreparedSend::set_range`](crate::PreparedSend::set_range), refusing a new range.
    PreparedSetRange = "PreparedSend::set_range", Data;
    /// [`PreparedSend::set_remote`](crate::PreparedSend::set_remote), refusing a new remote side.
    PreparedSetRemote = "PreparedSend::set_remote", Data;
    /// [`RecvQueue::post`](crate::RecvQueue::post) (of any receive kind), refusing a receive
    /// before `ibv_post_recv`: it was not posted.
    RecvQueuePost = "RecvQueue::post", Data;
    /// [`RecvQueue::post_batch`](crate::RecvQueue::post_batch), refusing a receive before
    /// `ibv_post_recv`: it and every receive after it were not posted.
    RecvQueuePostBatch = "RecvQueue::post_batch", Data;
    /// [`RecvQueue::prepare`](crate::RecvQueue::prepare), refusing a receive to prepare.
    RecvQueuePrepare = "RecvQueue::prepare", Data;
    /// [`RecvQueue::prepare_chain`](crate::RecvQueue::prepare_chain), refusing a chain.
    RecvQueuePrepareChain = "RecvQueue::prepare_chain", Data;
    /// [`SrqQueue::post`](crate::SrqQueue::post), refusing a receive before
    /// `ibv_post_srq_recv`: it was not posted.
    SrqQueuePost = "SrqQueue::post", Data;
    /// [`AsyncSendQueue::post`](crate::AsyncSendQueue::post) and `post_batch`, refusing
    /// before the queue below is asked: nothing was posted.
    AsyncSendQueuePost = "AsyncSendQueue::post", Data;
    /// [`AsyncRecvQueue::post`](crate::AsyncRecvQueue::post), refusing before the queue below
    /// is asked: nothing was posted.
    AsyncRecvQueuePost = "AsyncRecvQueue::post", Data;
    /// `complete` (or `complete_all`) of a [`SendQueue`](crate::SendQueue), refusing a
    /// completion that is not one of its outstanding requests.
    SendQueueComplete = "SendQueue::complete", Data;
    /// `complete` (or `complete_all`) of a [`RecvQueue`](crate::RecvQueue), refusing a
    /// completion that is not one of its outstanding receives.
    RecvQueueComplete = "RecvQueue::complete", Data;
    /// [`SrqQueue::complete`](crate::SrqQueue::complete), refusing a completion that is not
    /// one of its outstanding receives.
    SrqQueueComplete = "SrqQueue::complete", Data;
    /// [`CqBuilder::build`](crate::CqBuilder::build), refusing before `ibv_create_cq`.
    CqBuilderBuild = "CqBuilder::build", Control;
    /// [`QueuePairBuilder::build`](crate::QueuePairBuilder::build) (also under
    /// [`CmId::create_qp`](crate::CmId::create_qp)), refusing before the QP is created.
    QueuePairBuilderBuild = "QueuePairBuilder::build", Control;
    /// [`SharedReceiveQueue::new`](crate::SharedReceiveQueue::new), refusing before
    /// `ibv_create_srq`.
    SrqNew = "SharedReceiveQueue::new", Control;
    /// [`SharedReceiveQueue::arm`](crate::SharedReceiveQueue::arm), refusing before
    /// `ibv_modify_srq`.
    SrqArm = "SharedReceiveQueue::arm", Control;
    /// A test hook moving an empty queue's sequence numbers (`restart_sequence_at`).
    RestartSequenceAt = "restart_sequence_at", Data;
    ResizeCq = "ibv_resize_cq", Control;
    /// [`CompletionQueue::resize`](crate::CompletionQueue::resize), refusing before
    /// `ibv_resize_cq`.
    CqResize = "CompletionQueue::resize", Control;
    QueryDeviceEx = "ibv_query_device_ex", Control;
    ModifyCq = "ibv_modify_cq", Control;
    /// [`CompletionQueue::set_moderation`](crate::CompletionQueue::set_moderation),
    /// refusing before `ibv_modify_cq`.
    CqSetModeration = "CompletionQueue::set_moderation", Control;
    InitAhFromWc = "ibv_init_ah_from_wc", Control;
    /// [`AhAttr::from_completion`](crate::AhAttr::from_completion) (also under
    /// [`AddressHandle::from_completion`](crate::AddressHandle::from_completion)), refusing
    /// before `ibv_init_ah_from_wc`.
    AhFromCompletion = "AhAttr::from_completion", Control;
    AttachMcast = "ibv_attach_mcast", Control;
    DetachMcast = "ibv_detach_mcast", Control;
    /// [`QueuePair::attach_multicast`](crate::QueuePair::attach_multicast), refusing before
    /// `ibv_attach_mcast`.
    QpAttachMulticast = "QueuePair::attach_multicast", Control;
    ReregMr = "ibv_rereg_mr", Control;
    /// [`MemoryRegion::rereg_access`](crate::MemoryRegion::rereg_access) and
    /// [`rereg_buffer`](crate::MemoryRegion::rereg_buffer), refusing before `ibv_rereg_mr`.
    MrRereg = "MemoryRegion::rereg", Control;
    AdviseMr = "ibv_advise_mr", Control;
    /// [`MemoryRegion::advise`](crate::MemoryRegion::advise), refusing before `ibv_advise_mr`.
    MrAdvise = "MemoryRegion::advise", Control;
    /// [`ProtectionDomain::register_on_demand`](crate::ProtectionDomain::register_on_demand),
    /// refusing before `ibv_reg_mr` when the device has no ODP.
    PdRegisterOnDemand = "ProtectionDomain::register_on_demand", Control;
    OpenXrcd = "ibv_open_xrcd", Control;
    CloseXrcd = "ibv_close_xrcd", Control;
    /// [`XrcDomain::open`](crate::XrcDomain::open), refusing before `ibv_open_xrcd`.
    XrcDomainOpen = "XrcDomain::open", Control;
    AllocDm = "ibv_alloc_dm", Control;
    FreeDm = "ibv_free_dm", Control;
    MemcpyToDm = "ibv_memcpy_to_dm", Data;
    MemcpyFromDm = "ibv_memcpy_from_dm", Data;
    /// [`DeviceMemory::alloc`](crate::DeviceMemory::alloc), refusing before `ibv_alloc_dm`.
    DeviceMemoryAlloc = "DeviceMemory::alloc", Control;
    /// [`DeviceMemory::copy_to`](crate::DeviceMemory::copy_to) and
    /// [`copy_from`](crate::DeviceMemory::copy_from), refusing before the copy.
    DeviceMemoryCopy = "DeviceMemory::copy", Data;
    AllocTd = "ibv_alloc_td", Control;
    DeallocTd = "ibv_dealloc_td", Control;
    AllocParentDomain = "ibv_alloc_parent_domain", Control;
    /// [`ParentDomain::new`](crate::ParentDomain::new), refusing before
    /// `ibv_alloc_parent_domain`.
    ParentDomainNew = "ParentDomain::new", Control;
    AllocMw = "ibv_alloc_mw", Control;
    /// [`ProtectionDomain::alloc_mw`](crate::ProtectionDomain::alloc_mw), refusing before
    /// `ibv_alloc_mw` when the device has no memory windows.
    PdAllocMw = "ProtectionDomain::alloc_mw", Control;
    DeallocMw = "ibv_dealloc_mw", Control;
    BindMw = "ibv_bind_mw", Data;
    /// [`SendQueue::bind_mw`](crate::SendQueue::bind_mw) of a type 2 window (and an
    /// [`MwRequest::Bind`](crate::MwRequest::Bind) posted), refusing before `ibv_post_send`.
    SendQueueBindMw = "SendQueue::bind_mw", Data;
    /// [`SendQueue::bind_mw`](crate::SendQueue::bind_mw) of a type 1 window, refusing
    /// before `ibv_bind_mw`.
    SendQueueBindMwType1 = "SendQueue::bind_mw (type 1)", Data;
    /// [`SendQueue::invalidate_mw`](crate::SendQueue::invalidate_mw) of a type 2 window (a
    /// local invalidate, also as an [`MwRequest::LocalInv`](crate::MwRequest::LocalInv)
    /// posted), refusing before `ibv_post_send`.
    SendQueueInvalidateMw = "SendQueue::invalidate_mw", Data;
    /// [`SendQueue::invalidate_mw`](crate::SendQueue::invalidate_mw) of a type 1 window (a
    /// bind of length 0), refusing before `ibv_bind_mw`.
    SendQueueInvalidateMwType1 = "SendQueue::invalidate_mw (type 1)", Data;
    /// [`BoundWindow::invalidated_by`](crate::BoundWindow::invalidated_by), refusing a
    /// completion that did not invalidate this window.
    BoundWindowInvalidatedBy = "BoundWindow::invalidated_by", Data;
    RegMrIova = "ibv_reg_mr_iova", Control;
    /// [`ProtectionDomain::register_at_iova`](crate::ProtectionDomain::register_at_iova),
    /// refusing before `ibv_reg_mr_iova`.
    PdRegisterAtIova = "ProtectionDomain::register_at_iova", Control;
    QueryPkey = "ibv_query_pkey", Control;
    GetPkeyIndex = "ibv_get_pkey_index", Control;
    /// [`Context::query_pkey`](crate::Context::query_pkey) and
    /// [`pkey_index`](crate::Context::pkey_index), refusing before the C call.
    ContextPkey = "Context::query_pkey", Control;
    ForkInit = "ibv_fork_init", Control;
    /// [`udp_sport_from_flow_label`](crate::udp_sport_from_flow_label), refusing a label
    /// wider than 20 bits.
    UdpSportFromFlowLabel = "udp_sport_from_flow_label", Control;
    ModifyQpRateLimit = "ibv_modify_qp_rate_limit", Control;
    /// [`QueuePair::set_rate_limit`](crate::QueuePair::set_rate_limit), refusing before
    /// `ibv_modify_qp_rate_limit`.
    QpSetRateLimit = "QueuePair::set_rate_limit", Control;
    AllocNullMr = "ibv_alloc_null_mr", Control;
    QueryRtValuesEx = "ibv_query_rt_values_ex", Control;
    RegDmabufMr = "ibv_reg_dmabuf_mr", Control;
    /// [`ProtectionDomain::register_dmabuf`](crate::ProtectionDomain::register_dmabuf),
    /// refusing before `ibv_reg_dmabuf_mr`.
    PdRegisterDmabuf = "ProtectionDomain::register_dmabuf", Control;
    CreateCounters = "ibv_create_counters", Control;
    DestroyCounters = "ibv_destroy_counters", Control;
    ReadCounters = "ibv_read_counters", Control;
    AttachCountersPointFlow = "ibv_attach_counters_point_flow", Control;
    /// [`Counters::read`](crate::Counters::read) and
    /// [`FlowSpec::count`](crate::FlowSpec::count), refusing before the C call.
    CountersCheck = "Counters::read", Control;
    CreateFlow = "ibv_create_flow", Control;
    DestroyFlow = "ibv_destroy_flow", Control;
    /// [`Flow::new`](crate::Flow::new), refusing before `ibv_create_flow`.
    FlowNew = "Flow::new", Control;
    CreateWq = "ibv_create_wq", Control;
    ModifyWq = "ibv_modify_wq", Control;
    DestroyWq = "ibv_destroy_wq", Control;
    /// [`WorkQueue::new`](crate::WorkQueue::new), refusing before `ibv_create_wq`.
    WorkQueueCheck = "WorkQueue::new", Control;
    CreateRwqIndTable = "ibv_create_rwq_ind_table", Control;
    DestroyRwqIndTable = "ibv_destroy_rwq_ind_table", Control;
    /// [`RssTable::new`](crate::RssTable::new), refusing before `ibv_create_rwq_ind_table`.
    RssTableNew = "RssTable::new", Control;
    SetEce = "ibv_set_ece", Control;
    QueryEce = "ibv_query_ece", Control;
    /// [`QueuePair::set_ece`](crate::QueuePair::set_ece), refusing before `ibv_set_ece`.
    QpSetEce = "QueuePair::set_ece", Control;
    ImportDevice = "ibv_import_device", Control;
    /// [`Context::import`](crate::Context::import), refusing a descriptor that is not a
    /// character device before `ibv_import_device`.
    ContextImport = "Context::import", Control;
    ImportPd = "ibv_import_pd", Control;
    ImportMr = "ibv_import_mr", Control;
    OpenQp = "ibv_open_qp", Control;
    /// [`XrcDomain::open_qp`](crate::XrcDomain::open_qp), refusing before `ibv_open_qp`.
    XrcDomainOpenQp = "XrcDomain::open_qp", Control;
    CreateSrqEx = "ibv_create_srq_ex", Control;
    /// [`SharedReceiveQueue::xrc`](crate::SharedReceiveQueue::xrc), refusing before
    /// `ibv_create_srq_ex`.
    SrqXrc = "SharedReceiveQueue::xrc", Control;
    GetSrqNum = "ibv_get_srq_num", Control;
    /// [`SharedReceiveQueue::srq_num`](crate::SharedReceiveQueue::srq_num), refusing
    /// before `ibv_get_srq_num`.
    SrqNum = "SharedReceiveQueue::srq_num", Control;
    RegDmMr = "ibv_reg_dm_mr", Control;
    /// [`DeviceMemory::register`](crate::DeviceMemory::register), refusing before
    /// `ibv_reg_dm_mr`.
    DeviceMemoryRegister = "DeviceMemory::register", Control;
    SetOption = "rdma_set_option", Control;
    /// [`CmId::set_option`](crate::CmId::set_option), refusing before `rdma_set_option`.
    CmSetOption = "CmId::set_option", Control;
    JoinMulticastEx = "rdma_join_multicast_ex", Control;
    /// [`CmId::join_multicast_ex`](crate::CmId::join_multicast_ex), refusing before
    /// `rdma_join_multicast_ex`.
    CmJoinMulticastEx = "CmId::join_multicast_ex", Control;
    SetLocalEce = "rdma_set_local_ece", Control;
    /// [`CmId::set_local_ece`](crate::CmId::set_local_ece), refusing before
    /// `rdma_set_local_ece`.
    CmSetLocalEce = "CmId::set_local_ece", Control;
    GetRemoteEce = "rdma_get_remote_ece", Control;
    /// [`CmId::remote_ece`](crate::CmId::remote_ece), refusing before `rdma_get_remote_ece`.
    CmRemoteEce = "CmId::remote_ece", Control;
    RejectEce = "rdma_reject_ece", Control;
    InitQpAttr = "rdma_init_qp_attr", Control;
    /// [`CmId::qp_attr`](crate::CmId::qp_attr), refusing before `rdma_init_qp_attr`.
    CmQpAttr = "CmId::qp_attr", Control;
    /// [`CmId::modify_qp`](crate::CmId::modify_qp), refusing before `rdma_init_qp_attr`
    /// and `ibv_modify_qp`.
    CmModifyQp = "CmId::modify_qp", Control;
    /// [`CmId::connect_with`](crate::CmId::connect_with), refusing before `rdma_connect`.
    CmConnectWith = "CmId::connect_with", Control;
    /// [`CmId::accept_with`](crate::CmId::accept_with), refusing before `rdma_accept`.
    CmAcceptWith = "CmId::accept_with", Control;
    Establish = "rdma_establish", Control;
    /// [`CmId::establish`](crate::CmId::establish), refusing before `rdma_establish`.
    CmEstablish = "CmId::establish", Control;
    Notify = "rdma_notify", Control;
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Verb {
    /// Whether this is a function of C (libibverbs, librdmacm or libc), not a method of
    /// this crate.
    pub fn is_c_call(self) -> bool {
        let n = self.name();
        n.starts_with("ibv_")
            || n.starts_with("rdma_")
            || n.starts_with("fcntl")
            || n.starts_with("timerfd_")
            || n.starts_with("read(")
            || n == "poll"
    }

    /// For a post method of this crate, the C function it calls once its checks pass:
    /// a refusal of such a method means that call was never made.
    pub fn posts_through(self) -> Option<Verb> {
        use Verb as V;
        match self {
            V::SendQueuePost | V::SendQueuePostBatch | V::AsyncSendQueuePost => Some(V::PostSend),
            V::RecvQueuePost | V::RecvQueuePostBatch | V::AsyncRecvQueuePost => Some(V::PostRecv),
            V::SrqQueuePost => Some(V::PostSrqRecv),
            V::SendQueueBindMw | V::SendQueueInvalidateMw => Some(V::PostSend),
            V::SendQueueBindMwType1 | V::SendQueueInvalidateMwType1 => Some(V::BindMw),
            _ => None,
        }
    }
    /// The usual causes of an errno from this verb, as operators meet them.
    fn hint(self, errno: i32) -> Option<&'static str> {
        use Verb as V;
        Some(match (self, errno) {
            (V::RegMr | V::RegMrIova2 | V::RegMrIova, libc::ENOMEM | libc::EAGAIN) => {
                "the locked-memory limit is too low for this registration: raise `ulimit -l` \
                 (memlock in /etc/security/limits.conf, LimitMEMLOCK= for systemd services)"
            }
            (V::RegMr | V::RegMrIova2 | V::RegMrIova, libc::EFAULT) => {
                "the buffer is not mapped memory of this process"
            }
            (V::RegMr | V::RegMrIova2 | V::RegMrIova, libc::EINVAL) => {
                "remote write or atomic access also needs local write access, or the device refuses these flags"
            }
            (V::OpenDevice, libc::EACCES | libc::EPERM) => {
                "no permission on /dev/infiniband/uverbs*: add the user to the rdma group or fix the udev rules"
            }
            (V::OpenDevice, libc::ENOSYS | libc::EOPNOTSUPP) => {
                "no user-space provider for this device: install the provider library (ibverbs-providers / rdma-core)"
            }
            (V::AllocPd | V::CreateCq | V::CreateQp | V::CreateQpEx | V::CreateSrq | V::CreateAh, libc::EAGAIN) => {
                "the kernel refused more objects: the device's limits, or an rdma cgroup limit (rdma.max)"
            }
            (V::ModifyQp, libc::EINVAL) => {
                "an attribute is missing or not allowed for this state transition (RESET->INIT->RTR->RTS)"
            }
            (V::PostSend | V::PostRecv | V::PostSrqRecv, libc::ENOMEM) => {
                "the queue is full: poll completions before posting more"
            }
            (V::PostSend | V::PostRecv | V::PostSrqRecv, libc::EINVAL) => {
                "the work request is malformed for this QP (too many SGEs, inline data too large, or wrong QP state), \
                 or asks for what the device lacks (iWARP carries no immediate data, siw no atomics)"
            }
            (_, libc::ENOMEM) => {
                "the device or the kernel ran out of resources: check the device limits (max_qp, max_cqe, ...)"
            }
            (_, libc::EOPNOTSUPP | libc::ENOSYS) => "the provider or the kernel does not support this operation",
            (_, libc::ETIMEDOUT) => "the peer did not answer: check the link, the GID and the remote QP state",
            _ => return None,
        })
    }

    /// The usual cause of a wait on this verb that ran out of time.
    fn timeout_hint(self) -> Option<&'static str> {
        Some(match self {
            Verb::GetCqEvent => {
                "no completion arrived: was the CQ armed (req_notify) before the request completed, \
                 and was a signaled request posted at all?"
            }
            Verb::GetAsyncEvent => "the device reported nothing: usual for a healthy device",
            Verb::GetCmEvent
            | Verb::ResolveAddr
            | Verb::ResolveRoute
            | Verb::Connect
            | Verb::Accept
            | Verb::Disconnect => {
                "the peer or the fabric did not answer: check the address and port, that the server \
                 listens, and the route (ping the peer's IP over the RDMA netdev)"
            }
            Verb::Handshake => {
                "the peer sent nothing in time: is it running, on the same port, and past its own setup?"
            }
            _ => return None,
        })
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb returned an error.
    #[error("{verb} failed ({}): {source}{}", .verb.plane(), Hint(.hint.as_deref()))]
    Verb {
        /// The call that failed.
        verb: Verb,
        /// The errno the verb reported.
        #[source]
        source: io::Error,
        /// The usual cause, when it is known.
        hint: Option<Cow<'static, str>>,
    },
    /// An argument was rejected before any C code ran. `verb` is the method of this crate
    /// that refused it (`RecvQueue::post`, ...), or, for a check made on a C function's
    /// behalf, that function; the text says which and, for a post, that nothing was posted.
    #[error("{}", Refusal { verb: *.verb, what })]
    InvalidArgument {
        /// The verb the argument was meant for.
        verb: Verb,
        /// What is wrong with it.
        what: Cow<'static, str>,
    },
    /// A user-space library of rdma-core (libibverbs or librdmacm) is missing, unreadable
    /// or older than this program needs. Only a build with the feature `dlopen` sees this
    /// (a linked program does not start at all): [`devices`](crate::devices),
    /// [`Context::open`](crate::Context::open) and [`EventChannel::new`](crate::cm::EventChannel::new)
    /// return it, before any C call. The message names the library and the packages that
    /// install it.
    #[error("{0}")]
    Library(#[from] crate::ffi::dl::LoadError),
    /// The host has no RDMA device at all.
    #[error(
        "no RDMA device found (is an RDMA kernel driver loaded? for SoftRoCE: \
         `modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE`)"
    )]
    NoDevice,
    /// No device has the requested name.
    #[error("no RDMA device named {name:?}; available: {available}")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The names that exist, comma separated.
        available: String,
    },
    /// A RoCE port has no usable RoCE v2 GID.
    #[error(
        "{device} port {port}: no RoCE v2 GID with an IPv4 address \
         (the netdev under the device has no IPv4 address, or is down)"
    )]
    NoRoceV2Gid {
        /// The device name.
        device: String,
        /// The port number.
        port: u8,
    },
    /// A work request completed with an error status. A data-plane failure: the provider
    /// and the hardware (or the peer) ended the request, no errno is involved.
    ///
    /// Made by a queue's completion ([`Done::result`](crate::Done::result)), it names the
    /// operation and the caller's id; made from a bare completion
    /// ([`WorkCompletion::ok`](crate::WorkCompletion::ok)) it can name only the `wr_id`.
    #[error(
        "{} on QP {qp_num:#x} failed: {status} (vendor_err {vendor_err:#x}; {}){}",
        WhatFailed { op: *.op, id: *.id, wr_id: *.wr_id },
        Plane::Data,
        Hint(.status.hint())
    )]
    WorkCompletion {
        /// The completion status.
        status: WcStatus,
        /// The operation, when the queue that posted it says (a failed completion's own
        /// opcode field is undefined).
        op: Option<WcOpcode>,
        /// The caller's id of the request, when the queue that posted it says.
        id: Option<u64>,
        /// The `wr_id` the request was posted with (a safe queue's own, not the caller's).
        wr_id: u64,
        /// The local QP number.
        qp_num: u32,
        /// The provider's own error code (0 when it gives none).
        vendor_err: u32,
    },
    /// The peer's side refused a connection (rdma_cm's REJECTED event): the application
    /// rejected it, or nothing listens on that port.
    #[error("{verb}: connection rejected (reject reason {status}: {reason})")]
    Rejected {
        /// The call that asked for the connection, e.g. `rdma_connect`.
        verb: Verb,
        /// The transport's reason code: on InfiniBand and RoCE the IB CM reject reason
        /// (see [`RejectReason`](crate::cm::RejectReason)), on iWARP a negative errno.
        status: i32,
        /// The reason in words.
        reason: Cow<'static, str>,
        /// What the peer sent with its rejection (InfiniBand and RoCE pad it with zeros).
        private_data: Vec<u8>,
    },
    /// A wait ran out of time.
    #[error("{verb}: timed out after {}{}", Readable(*.timeout), Hint(.verb.timeout_hint()))]
    Timeout {
        /// What was being waited for.
        verb: Verb,
        /// How long we waited.
        timeout: Duration,
    },
    /// The byte stream of an endpoint exchange failed: an I/O error, or the peer closed
    /// it (see [`Handshake`](crate::Handshake)).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. "reading the peer's endpoint".
        what: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The device does not implement what was asked: it reports the capability as absent
    /// (checked before any C call; `errno` is `None`), or the provider or the kernel
    /// answered `EOPNOTSUPP` / `ENOSYS` (`errno` says which).
    #[error("{verb}: not supported by this device: {capability}{}", NotSupportedErrno(*.errno))]
    NotSupported {
        /// The C call or the method of ours that found out.
        verb: Verb,
        /// The capability, as the device reports it (e.g. `cq_mod_caps.max_cq_count 0`).
        capability: Cow<'static, str>,
        /// The errno the call returned, when it was C that said so.
        errno: Option<i32>,
    },
    /// A peer's message was malformed, described an endpoint this side cannot connect
    /// to, or said that the peer gave up (see [`Handshake`](crate::Handshake)).
    #[error("{what}: {source}")]
    Wire {
        /// What was being done, e.g. "reading the peer's endpoint".
        what: &'static str,
        /// What is wrong.
        #[source]
        source: WireError,
    },
}

/// "RecvQueue::post: refused before ibv_post_recv, nothing posted: ..." for a post
/// method, "ibv_create_cq: invalid argument (refused before the call): ..." for a check
/// made on a C function's behalf, "MemoryRegion::sge: invalid argument: ..." otherwise.
struct Refusal<'a> {
    verb: Verb,
    what: &'a str,
}

impl fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Refusal { verb, what } = self;
        match verb.posts_through() {
            Some(c) => write!(f, "{verb}: refused before {c}, nothing posted: {what}"),
            None if verb.is_c_call() => write!(f, "{verb}: invalid argument (refused before the call): {what}"),
            None => write!(f, "{verb}: invalid argument: {what}"),
        }
    }
}

/// " (EOPNOTSUPP from the provider)" when C said so, nothing when our check did.
struct NotSupportedErrno(Option<i32>);

impl fmt::Display for NotSupportedErrno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(libc::EOPNOTSUPP) => f.write_str(" (the call returned EOPNOTSUPP)"),
            Some(libc::ENOSYS) => f.write_str(" (the call returned ENOSYS)"),
            Some(e) => write!(f, " (the call returned errno {e})"),
            None => f.write_str(" (refused before the call)"),
        }
    }
}

struct Hint<'a>(Option<&'a str>);

/// A duration as people read it: "10 s", "1.5 s", "329 ms", "250 µs".
pub(crate) struct Readable(pub(crate) Duration);

impl fmt::Display for Readable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d >= Duration::from_secs(1) {
            let tenths = (d.as_millis() + 50) / 100;
            match tenths % 10 {
                0 => write!(f, "{} s", tenths / 10),
                t => write!(f, "{}.{t} s", tenths / 10),
            }
        } else if d >= Duration::from_millis(1) {
            write!(f, "{} ms", (d.as_micros() + 500) / 1000)
        } else {
            write!(f, "{} µs", d.as_micros())
        }
    }
}

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, "; hint: {h}"),
            None => Ok(()),
        }
    }
}

/// "RDMA WRITE id 7" when the queue said, "work request wr_id 0x..." when not.
struct WhatFailed {
    op: Option<WcOpcode>,
    id: Option<u64>,
    wr_id: u64,
}

impl fmt::Display for WhatFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.op, self.id) {
            (Some(op), Some(id)) => write!(f, "{op} id {id}"),
            (Some(op), None) => write!(f, "{op} (wr_id {:#x})", self.wr_id),
            (None, Some(id)) => write!(f, "work request id {id}"),
            (None, None) => write!(f, "work request wr_id {:#x}", self.wr_id),
        }
    }
}

impl Error {
    /// An error from a verb that reported `errno`, with the usual hint for that pair.
    pub fn verb(verb: Verb, errno: i32) -> Self {
        Error::Verb { verb, source: io::Error::from_raw_os_error(errno), hint: verb.hint(errno).map(Cow::Borrowed) }
    }

    /// An error from a verb that signalled failure and left the cause in `errno`.
    pub fn last_os(verb: Verb) -> Self {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        // Some verbs fail without setting errno; 0 would print as "Success".
        Self::verb(verb, if errno == 0 { libc::EIO } else { errno })
    }

    /// Replaces the hint (for callers that know more than the errno says).
    pub fn with_hint(mut self, text: impl Into<Cow<'static, str>>) -> Self {
        if let Error::Verb { hint, .. } = &mut self {
            *hint = Some(text.into());
        }
        self
    }

    /// An argument rejected before calling C.
    pub fn invalid(verb: Verb, what: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidArgument { verb, what: what.into() }
    }

    /// The device lacks `capability`: found by a check of ours before any C call.
    pub(crate) fn not_supported(verb: Verb, capability: impl Into<Cow<'static, str>>) -> Self {
        Error::NotSupported { verb, capability: capability.into(), errno: None }
    }

    /// What `verb` returning `errno` means: [`Error::NotSupported`] naming `capability` for
    /// `EOPNOTSUPP` and `ENOSYS`, [`Error::Verb`] for anything else.
    pub(crate) fn verb_or_not_supported(verb: Verb, errno: i32, capability: &'static str) -> Self {
        match errno {
            libc::EOPNOTSUPP | libc::ENOSYS => {
                Error::NotSupported { verb, capability: capability.into(), errno: Some(errno) }
            }
            _ => Error::verb(verb, errno),
        }
    }

    /// NULL from a create verb: its errno (`EIO` when none was set), as
    /// [`verb_or_not_supported`](Self::verb_or_not_supported) reads it.
    pub(crate) fn last_os_or_not_supported(verb: Verb, capability: &'static str) -> Self {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        Self::verb_or_not_supported(verb, if errno == 0 { libc::EIO } else { errno }, capability)
    }

    /// The errno, for errors that came from C.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } => source.raw_os_error(),
            Error::NotSupported { errno, .. } => *errno,
            _ => None,
        }
    }

    /// The plane a failed verb belongs to, for errors that came from C.
    pub fn plane(&self) -> Option<Plane> {
        match self {
            Error::Verb { verb, .. } => Some(verb.plane()),
            Error::WorkCompletion { .. } => Some(Plane::Data),
            _ => None,
        }
    }

    /// The verb this error is about, when there is one.
    pub fn verb_of(&self) -> Option<Verb> {
        match self {
            Error::Verb { verb, .. }
            | Error::InvalidArgument { verb, .. }
            | Error::Timeout { verb, .. }
            | Error::Rejected { verb, .. }
            | Error::NotSupported { verb, .. } => Some(*verb),
            Error::WorkCompletion { .. } => Some(Verb::PollCq),
            _ => None,
        }
    }

    /// The name of the verb this error is about, when there is one.
    pub fn verb_name(&self) -> Option<&'static str> {
        self.verb_of().map(Verb::name)
    }
}

/// The version of the endpoint wire format this build writes and reads
/// ([`crate::wire::VERSION`]).
pub(crate) const WIRE_VERSION: u8 = 1;

/// What is wrong with a message from the peer. Parsers return it instead of panicking,
/// and never allocate: every message has a fixed length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the message needs.
    #[error("{got} bytes, but the message needs {need}: it is truncated")]
    Truncated {
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// More bytes than the message has.
    #[error("{got} bytes, but the message is exactly {len}: trailing bytes")]
    Oversized {
        /// Bytes given.
        got: usize,
        /// The message's length.
        len: usize,
    },
    /// The message does not start with the expected magic: another protocol, or garbage.
    #[error("it starts with {}, not {expected:?}: not a message of this protocol", Magic(found))]
    BadMagic {
        /// The first bytes.
        found: [u8; 4],
        /// What they should be.
        expected: &'static str,
    },
    /// A version this build does not read.
    #[error("wire format version {found}, but this build reads version {WIRE_VERSION} only")]
    UnsupportedVersion {
        /// The version in the message.
        found: u8,
    },
    /// Flag bits this version does not define.
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    /// A transport code that is not RC, UC or UD.
    #[error("transport code {0} is not RC (2), UC (3) or UD (4)")]
    UnknownTransport(u8),
    /// A path MTU code outside 1..=5.
    #[error("path MTU code {0} is not an IB MTU (1 = 256 bytes ..= 5 = 4096 bytes)")]
    BadMtu(u32),
    /// A QP number wider than 24 bits.
    #[error("QP number {0:#x} does not fit in 24 bits")]
    QpnTooLarge(u32),
    /// QP 0 or 1: the management QPs, which no handshake connects to.
    #[error("QP number {0} is a management QP (0 and 1 are reserved)")]
    ReservedQpn(u32),
    /// A PSN wider than 24 bits.
    #[error("PSN {0:#x} does not fit in 24 bits")]
    PsnTooLarge(u32),
    /// Neither a LID nor a GID: nothing to address the peer by.
    #[error("neither a LID nor a GID: the endpoint cannot be reached")]
    NoAddress,
    /// A multicast (or the permissive) LID where a port's unicast LID belongs.
    #[error("LID {0:#06x} is a multicast or permissive LID, not a port's LID")]
    MulticastLid(u16),
    /// A Q_Key on an RC or UC endpoint, where it means nothing.
    #[error("Q_Key {qkey:#x} on a {transport} endpoint: only UD uses a Q_Key (it must be 0)")]
    QkeyNotUd {
        /// The transport.
        transport: QpType,
        /// The Q_Key found.
        qkey: u32,
    },
    /// A memory region on a UD endpoint: UD has no RDMA.
    #[error("a memory region on a UD endpoint: UD QPs cannot do RDMA")]
    MrOnUd,
    /// The flag says there is no memory region, but its fields are not zero.
    #[error("no memory region is flagged, but the memory-region fields are not zero")]
    StrayMrFields,
    /// A memory region whose end does not fit in 64 bits.
    #[error("memory region address {addr:#x} plus length {len} overflows 64 bits")]
    MrOverflow {
        /// Its address.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// rdma-core's pingpong text message is malformed at this byte.
    #[error("byte {offset} of the ibv_*_pingpong message: {what}")]
    Text {
        /// Offset of the first bad byte.
        offset: usize,
        /// What was expected there.
        what: &'static str,
    },
    /// A handshake status code this version does not define.
    #[error("unknown handshake status code {0}")]
    UnknownStatus(u8),
    /// The peer could not use this side's endpoint (its own log says why).
    #[error("the peer rejected this side's endpoint (its log says why)")]
    PeerRejected,
    /// The peer could not bring its QP up (its own log says why).
    #[error("the peer could not bring its QP up (its log says why)")]
    PeerFailed,
    /// The peer's endpoint is well formed but cannot be connected to from here.
    #[error("{0}")]
    Incompatible(String),
}

/// The first bytes of a message as hex, then as text where any of them is printable
/// ASCII (others as `.`): `47 45 54 20 ("GET ")` tells an HTTP client at once.
struct Magic<'a>(&'a [u8; 4]);

impl fmt::Display for Magic<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            write!(f, "{}{b:02x}", if i == 0 { "" } else { " " })?;
        }
        if self.0.iter().any(u8::is_ascii_graphic) {
            let text: String =
                self.0.iter().map(|&b| if b == b' ' || b.is_ascii_graphic() { b as char } else { '.' }).collect();
            write!(f, " ({text:?})")?;
        }
        Ok(())
    }
}

/// A value that a call did not take, handed back with the reason: a refused post brings
/// back its work request (and buffer), a failed completion its buffer. Like std's
/// [`TrySendError<T>`](std::sync::mpsc::TrySendError), it is an [`Error`](std::error::Error)
/// and converts into this crate's [`Error`] (dropping the value), so `?` works.
pub struct Refused<T> {
    /// Why.
    pub error: Error,
    /// What comes back.
    pub value: T,
}

impl<T> Refused<T> {
    /// The reason and the value.
    pub fn new(error: Error, value: T) -> Self {
        Refused { error, value }
    }

    /// The value, dropping the reason.
    pub fn into_value(self) -> T {
        self.value
    }

    /// The reason and the value, apart.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }

    /// The same reason with the value changed by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Refused<U> {
        Refused { error: self.error, value: f(self.value) }
    }
}

impl<T> fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> std::error::Error for Refused<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Refused<T>> for Error {
    fn from(r: Refused<T>) -> Error {
        r.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reg_mr_enomem_names_the_verb_the_plane_and_memlock() {
        let e = Error::verb(Verb::RegMr, libc::ENOMEM);
        let text = e.to_string();
        assert!(text.starts_with("ibv_reg_mr failed (control plane"), "{text}");
        assert!(text.contains("ulimit -l"), "{text}");
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert_eq!(e.plane(), Some(Plane::Control));
    }

    #[test]
    fn post_send_error_is_data_plane() {
        let e = Error::verb(Verb::PostSend, libc::EINVAL);
        assert!(e.to_string().contains("data plane"), "{e}");
        assert!(e.to_string().contains("malformed"), "{e}");
    }

    #[test]
    fn unknown_errno_has_no_hint() {
        let e = Error::verb(Verb::AllocPd, libc::EXDEV);
        assert!(!e.to_string().contains("hint"), "{e}");
    }

    #[test]
    fn eagain_on_create_points_at_the_rdma_cgroup() {
        let e = Error::verb(Verb::CreateQpEx, libc::EAGAIN);
        assert!(e.to_string().contains("rdma cgroup"), "{e}");
    }

    #[test]
    fn a_failed_completion_from_a_queue_names_the_operation_the_callers_id_the_qp_and_a_hint() {
        let e = Error::WorkCompletion {
            status: WcStatus::RemAccessErr,
            op: Some(WcOpcode::RdmaWrite),
            id: Some(7),
            wr_id: 1 << 40,
            qp_num: 0x11,
            vendor_err: 0,
        };
        let text = e.to_string();
        assert!(text.starts_with("RDMA WRITE id 7 on QP 0x11 failed: remote access error"), "{text}");
        assert!(text.contains("hint: the peer refused the memory access"), "{text}");
        assert!(!text.contains("1099511627776"), "the queue's wr_id stays out: {text}");
    }

    #[test]
    fn a_refusal_by_a_post_method_names_it_the_c_call_it_never_made_and_that_nothing_was_posted() {
        let cases = [
            (Verb::SendQueuePost, "SendQueue::post: refused before ibv_post_send, nothing posted: x"),
            (Verb::SendQueuePostBatch, "SendQueue::post_batch: refused before ibv_post_send, nothing posted: x"),
            (Verb::RecvQueuePost, "RecvQueue::post: refused before ibv_post_recv, nothing posted: x"),
            (Verb::RecvQueuePostBatch, "RecvQueue::post_batch: refused before ibv_post_recv, nothing posted: x"),
            (Verb::SrqQueuePost, "SrqQueue::post: refused before ibv_post_srq_recv, nothing posted: x"),
            (Verb::AsyncSendQueuePost, "AsyncSendQueue::post: refused before ibv_post_send, nothing posted: x"),
            (Verb::AsyncRecvQueuePost, "AsyncRecvQueue::post: refused before ibv_post_recv, nothing posted: x"),
        ];
        for (verb, want) in cases {
            assert_eq!(Error::invalid(verb, "x").to_string(), want);
            assert!(!verb.is_c_call() && verb.plane() == Plane::Data, "{verb}");
        }
    }

    #[test]
    fn a_refusal_names_our_method_or_says_the_c_function_was_not_called() {
        for (verb, want) in [
            (Verb::SendQueuePrepare, "SendQueue::prepare: invalid argument: x"),
            (Verb::RecvQueuePrepareChain, "RecvQueue::prepare_chain: invalid argument: x"),
            (Verb::QueuePairBuilderBuild, "QueuePairBuilder::build: invalid argument: x"),
            (Verb::CqBuilderBuild, "CqBuilder::build: invalid argument: x"),
            (Verb::ModifyQp, "ibv_modify_qp: invalid argument (refused before the call): x"),
        ] {
            assert_eq!(Error::invalid(verb, "x").to_string(), want);
        }
        // Every name is either a C function's or one of ours, and no method of ours
        // is taken for a C call.
        for verb in [Verb::Claim, Verb::Await, Verb::ChunkSge, Verb::MrSge, Verb::Handshake, Verb::SrqArm] {
            assert!(!verb.is_c_call(), "{verb}");
        }
        for verb in [Verb::PostSend, Verb::CreateCq, Verb::Connect, Verb::GetFl, Verb::Poll, Verb::TimerfdRead] {
            assert!(verb.is_c_call(), "{verb}");
        }
    }

    #[test]
    fn not_supported_names_who_found_out_and_the_capability_or_the_errno() {
        let ours = Error::not_supported(Verb::CqSetModeration, "cq_mod_caps.max_cq_count 0");
        assert_eq!(
            ours.to_string(),
            "CompletionQueue::set_moderation: not supported by this device: cq_mod_caps.max_cq_count 0 \
             (refused before the call)"
        );
        assert_eq!((ours.errno(), ours.verb_of()), (None, Some(Verb::CqSetModeration)));
        let c = Error::verb_or_not_supported(Verb::ModifyCq, libc::EOPNOTSUPP, "no modify_cq");
        assert_eq!(
            c.to_string(),
            "ibv_modify_cq: not supported by this device: no modify_cq (the call returned EOPNOTSUPP)"
        );
        assert_eq!(c.errno(), Some(libc::EOPNOTSUPP));
        let other = Error::verb_or_not_supported(Verb::ModifyCq, libc::EINVAL, "no modify_cq");
        assert!(matches!(other, Error::Verb { verb: Verb::ModifyCq, .. }), "{other:?}");
        for verb in [Verb::CqResize, Verb::CqSetModeration, Verb::AhFromCompletion, Verb::QpAttachMulticast] {
            assert!(!verb.is_c_call(), "{verb}");
            assert!(Error::invalid(verb, "x").to_string().ends_with(": invalid argument: x"), "{verb}");
        }
        for verb in [Verb::ResizeCq, Verb::ModifyCq, Verb::InitAhFromWc, Verb::AttachMcast, Verb::DetachMcast] {
            assert!(verb.is_c_call(), "{verb}");
        }
    }

    #[test]
    fn timeouts_carry_a_hint() {
        let e = Error::Timeout { verb: Verb::GetCqEvent, timeout: Duration::from_millis(5) };
        assert!(e.to_string().contains("hint: no completion arrived"), "{e}");
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let cases = [
            (Duration::from_secs(10), "10 s"),
            (Duration::from_millis(1500), "1.5 s"),
            (Duration::from_millis(999_960), "1000 s"),
            (Duration::from_nanos(328_590_150), "329 ms"),
            (Duration::from_micros(250), "250 µs"),
        ];
        for (d, want) in cases {
            assert_eq!(Readable(d).to_string(), want, "{d:?}");
        }
        let e = Error::Timeout { verb: Verb::Handshake, timeout: Duration::from_nanos(328_590_150) };
        assert!(e.to_string().contains("timed out after 329 ms"), "{e}");
    }

    #[test]
    fn a_refusal_converts_with_question_mark_and_keeps_the_value_until_then() {
        fn post() -> Result<(), Refused<Vec<u8>>> {
            Err(Refused::new(Error::invalid(Verb::SendQueuePost, "full"), vec![1, 2]))
        }
        fn caller() -> Result<()> {
            post()?;
            Ok(())
        }
        assert_eq!(post().unwrap_err().into_value(), vec![1, 2]);
        assert!(matches!(caller(), Err(Error::InvalidArgument { verb: Verb::SendQueuePost, .. })));
    }
}
