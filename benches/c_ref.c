/*
 * The C reference for the benches: the same work as the Rust loops, written the way a
 * C program uses the inline verbs of <infiniband/verbs.h>. Compiled by the root build.rs.
 */
#include <infiniband/verbs.h>
#include <string.h>

#define RV_MAX_BATCH 64

/*
 * Posts `batch` RDMA WRITEs of `len` bytes (the last one signaled) with one
 * ibv_post_send, then polls until their one completion arrives; `rounds` times.
 * Returns 0, a negative errno from ibv_post_send, or a positive failed status.
 */
int rv_c_write_poll(struct ibv_qp *qp, struct ibv_cq *cq, uint64_t laddr, uint32_t lkey, uint32_t len,
		    uint64_t raddr, uint32_t rkey, int batch, long rounds)
{
	struct ibv_sge sge[RV_MAX_BATCH];
	struct ibv_send_wr wr[RV_MAX_BATCH], *bad;
	struct ibv_wc wc;
	int i, got;
	long k;

	if (batch < 1 || batch > RV_MAX_BATCH)
		return -22;
	for (i = 0; i < batch; i++) {
		sge[i].addr = laddr;
		sge[i].length = len;
		sge[i].lkey = lkey;
		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].wr_id = i;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].opcode = IBV_WR_RDMA_WRITE;
		wr[i].send_flags = i == batch - 1 ? IBV_SEND_SIGNALED : 0;
		wr[i].wr.rdma.remote_addr = raddr;
		wr[i].wr.rdma.rkey = rkey;
		wr[i].next = i + 1 < batch ? &wr[i + 1] : NULL;
	}
	for (k = 0; k < rounds; k++) {
		int rc = ibv_post_send(qp, wr, &bad);
		if (rc)
			return -rc;
		do {
			got = ibv_poll_cq(cq, 1, &wc);
		} while (got == 0);
		if (got < 0)
			return -5;
		if (wc.status != IBV_WC_SUCCESS)
			return wc.status;
	}
	return 0;
}

/* Polls an empty CQ `rounds` times; returns how many completions it found (0). */
long rv_c_empty_poll(struct ibv_cq *cq, long rounds)
{
	struct ibv_wc wc[16];
	long k, found = 0;

	for (k = 0; k < rounds; k++)
		found += ibv_poll_cq(cq, 16, wc);
	return found;
}
