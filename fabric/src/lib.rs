//! s3dma's one-sided RDMA data plane.
