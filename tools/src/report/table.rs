//! The report as the table `s3dma-tools bench` prints: each measurement
//! beside its HTTP or raw-TCP counterpart and the machine's limits.

use super::*;

impl Report {
    /// The human-readable table, headline ratios first.
    #[must_use]
    pub(crate) fn table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "s3dma-tools bench{}: {} on loopback, {} CPUs, data in {}",
            if self.quick { " --quick" } else { "" },
            if self.fabric.is_empty() {
                "an existing stack".to_owned()
            } else {
                format!("{} fabric", self.fabric)
            },
            self.cpus,
            self.data_dir
        );
        let _ = writeln!(
            o,
            "GB/s = 10^9 bytes/s; large objects: median of {} rounds; small objects: {} s per cell",
            self.rounds,
            fmt_num(Some(self.cell_secs))
        );

        let _ = writeln!(
            o,
            "\nHeadline: s3dma ÷ HTTP (aws-sdk-s3 to the storage-target) and ÷ raw TCP"
        );
        let _ = writeln!(
            o,
            "  {:<28} {:>11} {:>14}",
            "", "s3dma/HTTP", "s3dma/raw TCP"
        );
        if let Some(large) = self.sizes.last() {
            for t in self.throughput.iter().filter(|t| t.size == *large) {
                let _ = writeln!(
                    o,
                    "  {:<28} {:>11} {:>14}",
                    format!("{} {}", t.op.label(), human_size(t.size.bytes)),
                    fmt_ratio(ratio(t.s3dma_gbps, t.http_gbps)),
                    fmt_ratio(ratio(t.s3dma_gbps, self.raw_tcp_gbps)),
                );
            }
        }
        let headline_cells = self.cells.iter().filter(|c| {
            Some(c.size.bytes) == self.cells.first().map(|f| f.size.bytes)
                && (c.in_flight == 64 || c.in_flight == 1)
        });
        for c in headline_cells {
            let what = if c.in_flight == 1 {
                format!("{} {} p50 latency", c.op.label(), human_size(c.size.bytes))
            } else {
                format!(
                    "{} {} ops/s @{}",
                    c.op.label(),
                    human_size(c.size.bytes),
                    c.in_flight
                )
            };
            // For latency, lower is better: show HTTP ÷ s3dma as the speed-up.
            let r = if c.in_flight == 1 {
                ratio(c.http.p50_us, c.s3dma.p50_us)
            } else {
                ratio(c.s3dma.ops_per_s, c.http.ops_per_s)
            };
            let _ = writeln!(o, "  {what:<28} {:>11} {:>14}", fmt_ratio(r), "");
        }
        let _ = writeln!(
            o,
            "  (latency rows: HTTP p50 ÷ s3dma p50, so above 1x means s3dma is faster)"
        );

        let _ = writeln!(o, "\nLarge objects, GB/s");
        let _ = writeln!(
            o,
            "  {:<10} {:<4} {:>8} {:>8} {:>11} {:>14}",
            "object", "op", "s3dma", "HTTP", "s3dma/HTTP", "s3dma/raw TCP"
        );
        for t in &self.throughput {
            let _ = writeln!(
                o,
                "  {:<10} {:<4} {:>8} {:>8} {:>11} {:>14}",
                human_size(t.size.bytes),
                t.op.label(),
                fmt_num(t.s3dma_gbps),
                fmt_num(t.http_gbps),
                fmt_ratio(ratio(t.s3dma_gbps, t.http_gbps)),
                fmt_ratio(ratio(t.s3dma_gbps, self.raw_tcp_gbps)),
            );
        }
        let _ = writeln!(
            o,
            "  raw loopback TCP (one stream, tokio): {} GB/s",
            fmt_num(self.raw_tcp_gbps)
        );
        let _ = writeln!(
            o,
            "  limits in this run: memcpy {} GB/s, MD5 (the store's) {} GB/s, write+fsync in the data directory {} GB/s",
            fmt_num(self.limits.memcpy_gbps),
            fmt_num(self.limits.md5_gbps),
            fmt_num(self.limits.write_fsync_gbps),
        );
        for t in &self.throughput {
            let (what, r) = match t.op {
                Op::Put => (
                    "of the store limit (min of MD5, write+fsync)",
                    ratio(t.s3dma_gbps, self.limits.store_gbps()),
                ),
                Op::Get => ("of memcpy", ratio(t.s3dma_gbps, self.limits.memcpy_gbps)),
            };
            let _ = writeln!(
                o,
                "  {} {}: s3dma {} {what}",
                t.op.label(),
                human_size(t.size.bytes),
                fmt_ratio(r)
            );
        }
        if self.disk.object_bytes > 0 {
            let _ = writeln!(
                o,
                "  PUT {} to a store on disk: s3dma {} GB/s, HTTP {} GB/s ({}); write+fsync there {} GB/s, s3dma {} of the lower of it and MD5",
                human_size(self.disk.object_bytes),
                fmt_num(self.disk.put_gbps),
                fmt_num(self.disk.http_put_gbps),
                fmt_ratio(ratio(self.disk.put_gbps, self.disk.http_put_gbps)),
                fmt_num(self.disk.write_fsync_gbps),
                fmt_ratio(ratio(
                    self.disk.put_gbps,
                    match (self.limits.md5_gbps, self.disk.write_fsync_gbps) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                )),
            );
        }
        if !self.procs.is_empty() {
            let _ = writeln!(
                o,
                "\nTenant processes on this host (each its own lease, buffer and {} object), aggregate GB/s",
                human_size(self.procs_object_bytes)
            );
            let _ = writeln!(
                o,
                "  {:>9} {:>8} {:>8} {:>8} {:>8}",
                "processes", "GET", "vs 1", "PUT", "vs 1"
            );
            let one = self.procs.iter().find(|r| r.processes == 1).copied();
            for r in &self.procs {
                let _ = writeln!(
                    o,
                    "  {:>9} {:>8} {:>8} {:>8} {:>8}",
                    r.processes,
                    fmt_num(r.get_gbps),
                    fmt_ratio(ratio(r.get_gbps, one.and_then(|o| o.get_gbps))),
                    fmt_num(r.put_gbps),
                    fmt_ratio(ratio(r.put_gbps, one.and_then(|o| o.put_gbps))),
                );
            }
        }

        let _ = writeln!(o, "\nSmall objects: ops/s and latency (µs)");
        let _ = writeln!(
            o,
            "  {:<7} {:<4} {:>6} | {:>8} {:>7} {:>7} | {:>8} {:>7} {:>7} | {:>10}",
            "object", "op", "flight", "s3dma/s", "p50", "p99", "HTTP/s", "p50", "p99", "ops ratio"
        );
        for c in &self.cells {
            let _ = writeln!(
                o,
                "  {:<7} {:<4} {:>6} | {:>8} {:>7} {:>7} | {:>8} {:>7} {:>7} | {:>10}",
                human_size(c.size.bytes),
                c.op.label(),
                c.in_flight,
                fmt_num(c.s3dma.ops_per_s),
                fmt_num(c.s3dma.p50_us),
                fmt_num(c.s3dma.p99_us),
                fmt_num(c.http.ops_per_s),
                fmt_num(c.http.p50_us),
                fmt_num(c.http.p99_us),
                fmt_ratio(ratio(c.s3dma.ops_per_s, c.http.ops_per_s)),
            );
        }

        if self.cells.iter().any(|c| c.layers != Layers::default()) {
            let _ = writeln!(
                o,
                "\nWhere an s3dma request's time goes: mean µs per request in each service \
                 (its own histogram; a layer includes those below it), and the difference \
                 each hop adds"
            );
            let _ = writeln!(
                o,
                "  {:<7} {:<4} {:>6} | {:>7} {:>7} {:>7} {:>7} | {:>12} {:>11} {:>12} | {:>8}",
                "object",
                "op",
                "flight",
                "client",
                "shim",
                "agent",
                "target",
                "client-shim",
                "shim-agent",
                "agent-target",
                "HTTP"
            );
            let minus = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
            for c in &self.cells {
                let l = c.layers;
                let _ = writeln!(
                    o,
                    "  {:<7} {:<4} {:>6} | {:>7} {:>7} {:>7} {:>7} | {:>12} {:>11} {:>12} | {:>8}",
                    human_size(c.size.bytes),
                    c.op.label(),
                    c.in_flight,
                    fmt_num(c.s3dma.mean_us),
                    fmt_num(l.shim_us),
                    fmt_num(l.agent_us),
                    fmt_num(l.target_us),
                    fmt_num(minus(c.s3dma.mean_us, l.shim_us)),
                    fmt_num(minus(l.shim_us, l.agent_us)),
                    fmt_num(minus(l.agent_us, l.target_us)),
                    fmt_num(c.http.mean_us),
                );
            }
        }

        self.cell_cpu_table(&mut o);
        self.batch_table(&mut o);

        let _ = writeln!(
            o,
            "\nCPU (utime+stime from /proc/PID/stat): s per GB of the large transfers, \
             µs per request (= ms per 1000) of the small ones"
        );
        let _ = writeln!(
            o,
            "  {:<20} {:>10} {:>10} {:>12} {:>12}",
            "process", "s3dma s/GB", "HTTP s/GB", "s3dma µs/req", "HTTP µs/req"
        );
        let rows: [(&str, Pick, bool); 5] = [
            ("dpu-agent", |c| c.agent, false),
            ("host-shim", |c| c.shim, false),
            ("storage-target", |c| c.target, true),
            ("client (this bench)", |c| c.client, true),
            ("total", |c| c.agent + c.shim + c.target + c.client, true),
        ];
        for (name, pick, http) in rows {
            if !self.services_cpu && name != "client (this bench)" {
                let _ = writeln!(
                    o,
                    "  {name:<20} (not measured: the services' pids are unknown)"
                );
                continue;
            }
            let h = |v: Option<f64>| if http { fmt_num(v) } else { "-".into() };
            let _ = writeln!(
                o,
                "  {:<20} {:>10} {:>10} {:>12} {:>12}",
                name,
                fmt_num(self.cpu_s3dma.s_per_gb(pick)),
                h(self.cpu_http.s_per_gb(pick)),
                fmt_num(self.cpu_s3dma.us_per_req(pick)),
                h(self.cpu_http.us_per_req(pick)),
            );
        }
        o
    }

    /// µs of CPU per request in each small cell, per process.
    fn cell_cpu_table(&self, o: &mut String) {
        if self.cells.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\nCPU per small request in each cell, µs (utime+stime over the cell; host = client + shim)"
        );
        let _ = writeln!(
            o,
            "  {:<7} {:<4} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>11} {:>11} | {:>9}",
            "object",
            "op",
            "flight",
            "client",
            "shim",
            "agent",
            "target",
            "host",
            "HTTP client",
            "HTTP target",
            "host/HTTP"
        );
        let svc = |v: Option<f64>| fmt_num(v.filter(|_| self.services_cpu));
        for c in &self.cells {
            let s = |pick: Pick| c.s3dma.us_per_req(&c.cpu.s3dma, pick);
            let h = |pick: Pick| c.http.us_per_req(&c.cpu.http, pick);
            let _ = writeln!(
                o,
                "  {:<7} {:<4} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>11} {:>11} | {:>9}",
                human_size(c.size.bytes),
                c.op.label(),
                c.in_flight,
                fmt_num(s(CELL_PROCS[0].1)),
                svc(s(CELL_PROCS[1].1)),
                svc(s(CELL_PROCS[2].1)),
                svc(s(CELL_PROCS[3].1)),
                svc(s(CELL_PROCS[4].1)),
                fmt_num(h(CELL_PROCS[0].1)),
                svc(h(CELL_PROCS[3].1)),
                fmt_ratio(ratio(
                    s(CELL_PROCS[4].1).filter(|_| self.services_cpu),
                    h(CELL_PROCS[0].1)
                )),
            );
        }
    }

    /// The batch phase: objects/s and CPU per object beside HTTP.
    fn batch_table(&self, o: &mut String) {
        if self.batches.is_empty() && self.batch_head_1000_ms.is_none() {
            return;
        }
        let _ = writeln!(
            o,
            "\nBatched calls (one call of N objects at a time) beside HTTP with N requests in flight: \
             objects/s, p50 µs (s3dma: per call), CPU µs per object"
        );
        let _ = writeln!(
            o,
            "  {:<7} {:<4} {:>5} | {:>8} {:>8} | {:>8} {:>7} | {:>7} | {:>6} {:>6} {:>6} {:>6} | {:>6} {:>6}",
            "object",
            "op",
            "batch",
            "s3dma/s",
            "call p50",
            "HTTP/s",
            "p50",
            "ratio",
            "client",
            "shim",
            "agent",
            "target",
            "HTTP c",
            "HTTP t"
        );
        let svc = |v: Option<f64>| fmt_num(v.filter(|_| self.services_cpu));
        for c in &self.batches {
            let _ = writeln!(
                o,
                "  {:<7} {:<4} {:>5} | {:>8} {:>8} | {:>8} {:>7} | {:>7} | {:>6} {:>6} {:>6} {:>6} | {:>6} {:>6}",
                human_size(c.size.bytes),
                c.op.label(),
                c.batch,
                fmt_num(c.s3dma_objects_per_s),
                fmt_num(c.s3dma_call_p50_us),
                fmt_num(c.http.ops_per_s),
                fmt_num(c.http.p50_us),
                fmt_ratio(ratio(c.s3dma_objects_per_s, c.http.ops_per_s)),
                fmt_num(c.s3dma_us_per_obj(CELL_PROCS[0].1)),
                svc(c.s3dma_us_per_obj(CELL_PROCS[1].1)),
                svc(c.s3dma_us_per_obj(CELL_PROCS[2].1)),
                svc(c.s3dma_us_per_obj(CELL_PROCS[3].1)),
                fmt_num(c.http_us_per_obj(CELL_PROCS[0].1)),
                svc(c.http_us_per_obj(CELL_PROCS[3].1)),
            );
        }
        let _ = writeln!(
            o,
            "  HEAD of 1,000 keys in one batched call: {} ms",
            fmt_num(self.batch_head_1000_ms)
        );
    }
}
