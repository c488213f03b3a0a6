//! With the `dc` feature: Rust bindings for the few mlx5dv calls and types
//! the DC transport uses, generated from rdma-core's `infiniband/mlx5dv.h`;
//! every `ibv_*` type they mention is rdma-sys's own.

fn main() {
    #[cfg(feature = "dc")]
    dc::generate();
}

#[cfg(feature = "dc")]
mod dc {
    use std::path::PathBuf;

    pub(super) fn generate() {
        println!("cargo:rerun-if-changed=build.rs");
        let bindings = bindgen::Builder::default()
            .header_contents("s3dma-mlx5dv.h", "#include <infiniband/mlx5dv.h>\n")
            .allowlist_function("mlx5dv_is_supported")
            .allowlist_function("mlx5dv_create_qp")
            .allowlist_function("mlx5dv_qp_ex_from_ibv_qp_ex")
            .allowlist_type("mlx5dv_qp_init_attr")
            .allowlist_type("mlx5dv_qp_ex")
            .allowlist_type("mlx5dv_dc_type")
            .allowlist_type("mlx5dv_qp_init_attr_mask")
            // rdma-sys defines these; the generated code names them.
            .blocklist_type("ibv_.*")
            .blocklist_type("verbs_.*")
            .blocklist_type("in6_addr")
            .blocklist_type("sockaddr.*")
            .blocklist_type("timespec")
            .blocklist_type("pthread_.*")
            .prepend_enum_name(false)
            .layout_tests(false)
            .generate()
            .expect(
                "generating mlx5dv bindings for the `dc` feature: install libibverbs-dev \
                 (infiniband/mlx5dv.h) and libclang",
            );
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("mlx5dv.rs");
        // Edition 2024 wants `unsafe extern` blocks; this bindgen (the one
        // rdma-sys builds with) writes plain `extern`.
        let code = bindings
            .to_string()
            .replace("extern \"C\" {", "unsafe extern \"C\" {");
        std::fs::write(&out, code).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
        println!("cargo:rustc-link-lib=mlx5");
    }
}
