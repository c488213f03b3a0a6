//! The s3dma storage-target: an S3-compatible object server.
