/* The headers rdma-sys binds: libibverbs and librdmacm from rdma-core. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
