// Verilator harness of the mmfree core (hw.top.Accelerator exported by hw/export.py as `mmfree_core`).
//
// The stimulus lives here, not in Python: the model image is loaded once into memory (one byte stream
// per weight channel, built by host/devices/rtl.py), and every token is driven at full rate (tvalid high
// every cycle, respecting tready): channel 0 carries the token packet (tlast on its last beat) then its
// image stream (tlast on its last beat), channel c > 0 its weight blocks (tlast on the last beat). The
// output stream (m_axis_out, 32-bit) is always ready. Registers are reached through a small AXI4-Lite
// manager (one transaction at a time, ARM IHI 0022E chapter B1).
//
// The Verilated top is not the core but `mmfree_sim` (sim_top.v, written by rtl_harness/__init__.py): it
// holds every input of the core in a register that a DPI-C call, `hx_edge` below, loads at each rising
// clock edge from the state of this file's stream feeds, output sink and AXI4-Lite manager, after
// sampling the core's outputs (their values before the edge, IEEE 1800 nonblocking semantics). The only
// primary input is the clock, so no logic of the core is "input combinational": Verilator evaluates it
// once per cycle after the edge instead of once more at every eval(), which made the direct drive of the
// core's ports about 1.5x slower. The timing is the same as a testbench that sets the inputs before a
// cycle and samples the handshakes at its rising edge.
//
// Build (host/devices/rtl_harness/__init__.py does this):
//   verilator --cc --exe -DCHANNELS=C -DBUS_BITS=B ... sim_top.v mmfree_core.v harness.cpp
//
// Usage: harness [--hang-cycles N] [--fst PATH] CH0_FILE [CH1_FILE ...]
// (--fst names the waveform file of a trace build: FST with --trace-fst, VCD with --trace.)
//
// Protocol (stdin -> stdout, little-endian; one reply per request):
//   request  = u8 command, u32 length, payload[length]
//   reply    = u8 code ('K' ok, 'E' token failed, 'X' bad request), u32 length, payload[length]
//   'T'  run a token.   payload: u32 flags (bit 0: dump a waveform of this token, bit 1: profile it per
//        instruction, bit 2: write CTRL.abort during it, bit 3: report end_cycle), with bit 2 a u32 cycle (the
//        harness starts the AXI4-Lite write of hw.isa.Ctrl.ABORT that many cycles after the token's first
//        cycle), token packet bytes.
//        reply payload: u32 kind (0 ok, 1 core error, 2 timeout), u64 cycles, u64 wall_ns, u64 cpu_ns,
//                       u32 status, u32 error_cause, u32 error_where, u32 n_counters,
//                       n_counters x u64 (counter increments of this token, hw.isa.Counter order),
//                       u32 out_len, out bytes (the output packet), u32 msg_len, msg (what went wrong),
//                       with bit 3: u64 end_cycle (cycles from the token's first cycle to the output word with
//                       tlast; 0: none),
//                       and when profiled: u32 n_instr, n_instr x n_counters x u64 (increments per instruction)
//   'R'  hard reset (rst for 4 cycles): zeroes the recurrent state and the counters.  reply: u64 cycle
//   'I'  replace the image streams.  payload: per channel u32 length, bytes (whole beats).  reply: empty
//   'r'  AXI4-Lite read.  payload: u32 addr.  reply: u32 data
//   'w'  AXI4-Lite write. payload: u32 addr, u32 data.  reply: empty
//   'Q'  quit.  reply: empty
// The reply to 'T' with kind 1 comes after the harness has written CTRL.clear (the core waits for the
// next token packet, its committed state untouched); kind 2 comes after a hard reset (state lost).

#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "Vmmfree_sim.h"
#include "Vmmfree_sim__Dpi.h"
#include "Vmmfree_sim___024root.h"
#include "verilated.h"
#if VM_TRACE_FST
#include "verilated_fst_c.h"
using TraceFile = VerilatedFstC;
#elif VM_TRACE
#include "verilated_vcd_c.h"
using TraceFile = VerilatedVcdC;
#endif

#ifndef CHANNELS
#error "define CHANNELS (1-4)"
#endif
#ifndef BUS_BITS
#error "define BUS_BITS (64, 128, 256 or 512)"
#endif

static constexpr int kBeatBytes = BUS_BITS / 8;
static constexpr int kMaxChannels = 4;         // the DPI call's fixed shape (sim_top.v ties off the rest)
static constexpr uint32_t kStatus = 0x44, kErrorCause = 0x48, kErrorWhere = 0x4C, kCtrl = 0x40;
static constexpr uint32_t kCounters = 0x80;
static constexpr int kNumCounters = 12;   // hw.isa.Counter

// The core's counter registers, in hw.isa.Counter order (readable thanks to public.vlt): the per-instruction
// profile snapshots them at instruction boundaries without disturbing the core.
#define CTR(name) top->rootp->mmfree_sim__DOT__core__DOT__counter_##name
#define ALL_COUNTERS(X) \
    X(cycles) X(stream_beats) X(stream_stalls) X(out_stalls) X(gemv_cycles) X(quant_cycles) X(scalar_cycles) \
    X(trits) X(nonzero_trits) X(epilogue_elements) X(instructions) X(tokens)

// CPU time of this process (the simulation is single-threaded): the speed measure that other processes'
// load on the machine does not dilute
static uint64_t cpu_now_ns() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// ---------------------------------------------------------------------------------------- streams
struct Segment {
    const uint8_t* data = nullptr;
    size_t beats = 0;
};

// A channel's beats for one token: up to two segments (token packet, image), tlast on each's last beat.
struct Feed {
    Segment seg[2];
    int nseg = 0;
    int cur = 0;
    size_t pos = 0;
    bool done() const { return cur >= nseg; }
    const uint8_t* beat() const { return seg[cur].data + pos * kBeatBytes; }
    bool last() const { return pos + 1 == seg[cur].beats; }
    void advance() {
        if (++pos == seg[cur].beats) {
            pos = 0;
            ++cur;
            while (cur < nseg && seg[cur].beats == 0) ++cur;
        }
    }
    void start() {
        cur = 0;
        pos = 0;
        while (cur < nseg && seg[cur].beats == 0) ++cur;
    }
    void stop() { cur = nseg; }
    size_t total() const { return seg[0].beats + (nseg > 1 ? seg[1].beats : 0); }
    size_t taken() const {
        size_t t = 0;
        for (int i = 0; i < cur && i < nseg; ++i) t += seg[i].beats;
        return t + (done() ? 0 : pos);
    }
};

// What the core's inputs hold during the current cycle (the registers of sim_top.v, loaded at the last edge).
struct Drive {
    bool rst = true;
    bool tvalid[kMaxChannels] = {};
    bool tlast[kMaxChannels] = {};
    uint8_t tdata[kMaxChannels][kBeatBytes] = {};
    bool awvalid = false, wvalid = false, bready = false, arvalid = false, rready = false;
    uint32_t awaddr = 0, wdata = 0, araddr = 0;
};

// The AXI4-Lite transaction the manager works on (kind 0: none, 1: read, 2: write).
struct AxiRequest {
    int kind = 0;
    uint32_t addr = 0, data = 0, rdata = 0;
    bool addr_done = false, data_done = false, done = false;
};

struct Harness;
static Harness* g_harness = nullptr;

struct Harness {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vmmfree_sim> top;
    std::vector<std::vector<uint8_t>> image;     // per channel
    Feed feed[CHANNELS];
    Drive drv;
    uint64_t cycle = 0;
    uint64_t base[kNumCounters] = {};
    uint64_t hang_cycles = 100000;
    std::string fst_path;
#if VM_TRACE
    std::unique_ptr<TraceFile> fst;
#endif

    // what the next edges load into the core's inputs
    bool streams_on = false;        // drive the feeds (else tvalid low)
    bool rst_request = true;
    AxiRequest ax;
    // what the last rising edge saw (set by hx_edge)
    bool progress = false;          // a stream transfer happened at the last edge
    std::vector<uint32_t> out_words;
    bool out_last = false;

    Harness() : ctx(new VerilatedContext) {
#if VM_TRACE
        ctx->traceEverOn(true);
#endif
        top.reset(new Vmmfree_sim{ctx.get()});
        g_harness = this;
        top->clk = 0;
        top->eval();
    }

    // Called at every rising clock edge with the core's outputs before the edge (the handshakes of the cycle
    // that ends): updates the feeds, the output sink and the AXI4-Lite transaction, and sets `drv` to the
    // inputs of the next cycle.
    void edge(const svBit* tready, svBit out_tvalid, svBit out_tlast, uint32_t out_tdata, svBit awready,
              svBit wready, svBit bvalid, svBit arready, svBit rvalid, uint32_t rdata) {
        bool any = false;
        for (int c = 0; c < CHANNELS; ++c)
            if (drv.tvalid[c] && tready[c]) {
                feed[c].advance();
                any = true;
            }
        if (out_tvalid) {   // tready is always high
            out_words.push_back(out_tdata);
            if (out_tlast) out_last = true;
            any = true;
        }
        progress = any;
        if ((drv.arvalid && arready) || (drv.awvalid && awready)) ax.addr_done = true;
        if (drv.wvalid && wready) ax.data_done = true;
        if (drv.rready && rvalid) {
            ax.rdata = rdata;
            ax.done = true;
        }
        if (drv.bready && bvalid) ax.done = true;
        // the next cycle
        drv.rst = rst_request;
        for (int c = 0; c < CHANNELS; ++c) {
            Feed& f = feed[c];
            if (streams_on && !f.done()) {
                std::memcpy(drv.tdata[c], f.beat(), kBeatBytes);
                drv.tvalid[c] = true;
                drv.tlast[c] = f.last();
            } else {
                drv.tvalid[c] = false;
                drv.tlast[c] = false;
            }
        }
        const bool rd = ax.kind == 1, wr = ax.kind == 2;
        drv.arvalid = rd && !ax.addr_done;
        drv.araddr = ax.addr;
        drv.rready = rd && !ax.done;
        drv.awvalid = wr && !ax.addr_done;
        drv.awaddr = ax.addr;
        drv.wvalid = wr && !ax.data_done;
        drv.wdata = ax.data;
        drv.bready = wr && !ax.done;
    }

    // One clock cycle: falling edge, rising edge (where hx_edge runs).
    void tick() {
        top->clk = 0;
        top->eval();
#if VM_TRACE
        if (fst) fst->dump(2 * cycle);
#endif
        top->clk = 1;
        top->eval();
#if VM_TRACE
        if (fst) fst->dump(2 * cycle + 1);
#endif
        ++cycle;
    }

    // Stop driving the streams from the next edge on (a beat already loaded may still be taken: the feed
    // counts it).
    void idle_streams() { streams_on = false; }

    // ------------------------------------------------------------------ AXI4-Lite manager
    uint32_t axil(int kind, uint32_t addr, uint32_t data) {
        ax = AxiRequest{};
        ax.kind = kind;
        ax.addr = addr;
        ax.data = data;
        for (int i = 0; i < 64; ++i) {
            tick();
            if (ax.done) {
                ax.kind = 0;
                return ax.rdata;
            }
        }
        std::fprintf(stderr, "harness: AXI4-Lite %s of 0x%x got no response\n", kind == 1 ? "read" : "write", addr);
        std::exit(3);
    }
    uint32_t axil_read(uint32_t addr) { return axil(1, addr, 0); }
    void axil_write(uint32_t addr, uint32_t data) { axil(2, addr, data); }

    struct Snapshot {
        uint64_t v[kNumCounters];
    };
    Snapshot snapshot() const {
        Snapshot s;
        int i = 0;
#define SNAP(name) s.v[i++] = CTR(name);
        ALL_COUNTERS(SNAP)
#undef SNAP
        return s;
    }
    std::vector<Snapshot> profile;   // counters at every instruction boundary of the last profiled token

    uint64_t read_counter(int i) {
        uint64_t lo = axil_read(kCounters + 8 * i);
        uint64_t hi = axil_read(kCounters + 8 * i + 4);
        return lo | (hi << 32);
    }

    void hard_reset() {
        idle_streams();
        for (int c = 0; c < CHANNELS; ++c) feed[c].stop();
        ax = AxiRequest{};
        rst_request = true;
        for (int i = 0; i < 5; ++i) tick();   // rst is a register: high from the first edge on
        rst_request = false;
        tick();
        tick();
        std::memset(base, 0, sizeof base);
    }

    // ------------------------------------------------------------------ one token
    struct Result {
        uint32_t kind = 0, status = 0, cause = 0, where = 0;
        uint64_t cycles = 0, wall_ns = 0, cpu_ns = 0, end_cycle = 0;
        uint64_t counters[kNumCounters] = {};
        std::string msg;
    };

    void read_counters(Result& res) {
        for (int i = 0; i < kNumCounters; ++i) {
            uint64_t v = read_counter(i);
            res.counters[i] = v - base[i];
            base[i] = v;
        }
    }

    // Finish an AXI4-Lite transaction started without waiting (the abort write), so that the next one can start.
    void finish_axil() {
        for (int i = 0; i < 64 && ax.kind != 0; ++i) {
            tick();
            if (ax.done) ax.kind = 0;
        }
    }

    Result run_token(const std::vector<uint8_t>& packet, bool dump, bool prof, int64_t abort_at = -1) {
        Result res;
        profile.clear();
        if (prof) profile.push_back(snapshot());
        uint64_t instr_seen = CTR(instructions);
        if (packet.size() % kBeatBytes) {
            res.kind = 2;
            res.msg = "token packet is not a whole number of beats";
            return res;
        }
        feed[0].seg[0] = {packet.data(), packet.size() / kBeatBytes};
        feed[0].seg[1] = {image[0].data(), image[0].size() / kBeatBytes};
        feed[0].nseg = 2;
        for (int c = 1; c < CHANNELS; ++c) {
            feed[c].seg[0] = {image[c].data(), image[c].size() / kBeatBytes};
            feed[c].nseg = 1;
        }
        for (int c = 0; c < CHANNELS; ++c) feed[c].start();
        out_words.clear();
        out_last = false;
#if VM_TRACE
        if (dump && !fst_path.empty()) {
            fst.reset(new TraceFile);
            top->trace(fst.get(), 99);
            fst->open(fst_path.c_str());
        }
#else
        (void)dump;
#endif
        auto t0 = std::chrono::steady_clock::now();
        uint64_t c0 = cpu_now_ns();
        uint64_t start = cycle;
        uint64_t last_progress = cycle;
        streams_on = true;
        tick();   // the first beats go out at this edge
        bool first_taken = false;
        uint64_t first_cycle = 0;
        // the profile: a snapshot whenever INSTRUCTIONS moves (an instruction completed)
        auto boundary = [&] {
            if (prof && CTR(instructions) != instr_seen) {
                instr_seen = CTR(instructions);
                profile.push_back(snapshot());
            }
        };
        while (!out_last) {
            if (abort_at >= 0 && cycle - start == uint64_t(abort_at)) {
                ax = AxiRequest{};       // CTRL.abort, written while the streams run (the loop ticks it through)
                ax.kind = 2;
                ax.addr = kCtrl;
                ax.data = 2;             // hw.isa.Ctrl.ABORT
            }
            tick();
            if (ax.kind != 0 && ax.done) ax.kind = 0;
            if (out_last) res.end_cycle = cycle - start;
            if (progress) last_progress = cycle;
            boundary();
            if (!first_taken && feed[0].taken() > 0) {
                first_taken = true;
                first_cycle = cycle;
            }
            // irq = done | error; `done` of the previous token clears two cycles after the first word
            if (first_taken && cycle - first_cycle > 4 && top->irq) {
                idle_streams();   // no beat may be taken while the register reads clock the core
                finish_axil();
                uint32_t st = axil_read(kStatus);
                if (st & 4) {
                    res.kind = 1;
                    res.status = st;
                    res.cause = axil_read(kErrorCause);
                    res.where = axil_read(kErrorWhere);
                    res.msg = "the core stopped the token (STATUS.error) at channel 0 beat " +
                              std::to_string(feed[0].taken()) + " of " + std::to_string(feed[0].total());
                    axil_write(kCtrl, 1);   // CTRL.clear: back to waiting for a token packet
                    for (int i = 0; i < 4; ++i) tick();
                    break;
                }
                streams_on = true;
            }
            if (cycle - last_progress > hang_cycles) {
                idle_streams();
                res.kind = 2;
                res.status = axil_read(kStatus);
                res.msg = "timeout: no stream transfer for " + std::to_string(hang_cycles) +
                          " cycles (channel 0 at beat " + std::to_string(feed[0].taken()) + " of " +
                          std::to_string(feed[0].total()) + ", " + std::to_string(out_words.size()) +
                          " output words); the core was reset, its state is lost";
                hard_reset();
                break;
            }
            if (out_words.size() > (1u << 22)) {
                idle_streams();
                res.kind = 2;
                res.msg = "runaway output stream (more than 4 M words without tlast); core reset";
                hard_reset();
                break;
            }
        }
        idle_streams();
        finish_axil();
        if (res.kind == 0) {
            // the commit (done) follows the trailer's last word within a few cycles
            for (int i = 0; i < 16 && !top->irq; ++i) {
                tick();
                boundary();
            }
            tick();
            boundary();
            tick();
            boundary();
            res.cycles = cycle - start;
            uint32_t st = axil_read(kStatus);
            if (st & 4) {   // an error that closed the output packet (hw.isa.OUTPUT_ABORT_WORD with tlast)
                res.kind = 1;
                res.status = st;
                res.cause = axil_read(kErrorCause);
                res.where = axil_read(kErrorWhere);
                res.msg = "the core stopped the token (STATUS.error) after its output packet was cut";
                axil_write(kCtrl, 1);
                for (int i = 0; i < 4; ++i) tick();
                read_counters(res);
            } else {
                // a core that does not count END_TOKEN in INSTRUCTIONS: what counted since the last boundary is
                // END_TOKEN's (a core that does has counted nothing since its commit)
                if (prof) {
                    Snapshot s = snapshot();
                    if (std::memcmp(s.v, profile.back().v, sizeof s.v) != 0) profile.push_back(s);
                }
                res.status = st;
                read_counters(res);
            }
        } else {
            res.cycles = cycle - start;
            if (res.kind == 1) read_counters(res);
        }
        for (int c = 0; c < CHANNELS; ++c) feed[c].stop();
        res.cpu_ns = cpu_now_ns() - c0;
        res.wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                          .count();
#if VM_TRACE
        if (fst) {
            fst->close();
            fst.reset();
        }
#endif
        return res;
    }
};

// The DPI-C import of sim_top.v: one call per rising clock edge.
void hx_edge(const svBitVecVal* tready, svBit out_tvalid, svBit out_tlast, int out_tdata, svBit awready,
             svBit wready, svBit bvalid, svBit arready, svBit rvalid, int rdata, svBit* rst, svBitVecVal* tvalid,
             svBitVecVal* tlast, svBitVecVal* tdata, svBit* awvalid, int* awaddr, svBit* wvalid, int* wdata,
             svBit* bready, svBit* arvalid, int* araddr, svBit* rready) {
    Harness& h = *g_harness;
    svBit ready[kMaxChannels];
    for (int c = 0; c < kMaxChannels; ++c) ready[c] = (tready[0] >> c) & 1;
    h.edge(ready, out_tvalid, out_tlast, uint32_t(out_tdata), awready, wready, bvalid, arready, rvalid,
           uint32_t(rdata));
    const Drive& d = h.drv;
    *rst = d.rst;
    uint32_t v = 0, l = 0;
    for (int c = 0; c < CHANNELS; ++c) {
        v |= uint32_t(d.tvalid[c]) << c;
        l |= uint32_t(d.tlast[c]) << c;
        std::memcpy(reinterpret_cast<uint8_t*>(tdata) + c * kBeatBytes, d.tdata[c], kBeatBytes);
    }
    tvalid[0] = v;
    tlast[0] = l;
    *awvalid = d.awvalid;
    *awaddr = int(d.awaddr);
    *wvalid = d.wvalid;
    *wdata = int(d.wdata);
    *bready = d.bready;
    *arvalid = d.arvalid;
    *araddr = int(d.araddr);
    *rready = d.rready;
}

// ---------------------------------------------------------------------------------------- I/O
static bool read_exact(void* buf, size_t n) {
    auto* p = static_cast<uint8_t*>(buf);
    while (n) {
        size_t k = std::fread(p, 1, n, stdin);
        if (k == 0) return false;
        p += k;
        n -= k;
    }
    return true;
}

struct Writer {
    std::vector<uint8_t> b;
    void u8(uint8_t v) { b.push_back(v); }
    void u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
    }
    void u64(uint64_t v) {
        for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
    }
    void bytes(const void* p, size_t n) {
        auto* q = static_cast<const uint8_t*>(p);
        b.insert(b.end(), q, q + n);
    }
};

static void reply(char code, const Writer& w) {
    uint8_t head[5];
    head[0] = uint8_t(code);
    uint32_t n = uint32_t(w.b.size());
    std::memcpy(head + 1, &n, 4);
    std::fwrite(head, 1, 5, stdout);
    if (n) std::fwrite(w.b.data(), 1, n, stdout);
    std::fflush(stdout);
}

static std::vector<uint8_t> read_file(const char* path) {
    FILE* f = std::fopen(path, "rb");
    if (!f) {
        std::fprintf(stderr, "harness: cannot open %s\n", path);
        std::exit(2);
    }
    std::vector<uint8_t> out;
    uint8_t buf[1 << 16];
    size_t k;
    while ((k = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + k);
    std::fclose(f);
    return out;
}

int main(int argc, char** argv) {
    Harness h;
    std::vector<const char*> files;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--hang-cycles" && i + 1 < argc) {
            h.hang_cycles = std::strtoull(argv[++i], nullptr, 10);
        } else if (a == "--fst" && i + 1 < argc) {
            h.fst_path = argv[++i];
        } else if (a.rfind("--", 0) == 0) {
            std::fprintf(stderr, "harness: unknown option %s\n", a.c_str());
            return 2;
        } else {
            files.push_back(argv[i]);
        }
    }
    if (files.size() != CHANNELS) {
        std::fprintf(stderr, "harness: built for %d channel(s), got %zu stream file(s)\n", CHANNELS, files.size());
        return 2;
    }
    for (int c = 0; c < CHANNELS; ++c) {
        h.image.push_back(read_file(files[c]));
        if (h.image.back().size() % kBeatBytes) {
            std::fprintf(stderr, "harness: %s is not a whole number of %d-byte beats\n", files[c], kBeatBytes);
            return 2;
        }
    }
    h.hard_reset();
    for (;;) {
        uint8_t head[5];
        if (!read_exact(head, 5)) return 0;   // the host closed the pipe
        uint32_t len;
        std::memcpy(&len, head + 1, 4);
        std::vector<uint8_t> payload(len);
        if (len && !read_exact(payload.data(), len)) return 0;
        Writer w;
        switch (head[0]) {
            case 'T': {
                if (len < 4) {
                    reply('X', w);
                    break;
                }
                uint32_t flags;
                std::memcpy(&flags, payload.data(), 4);
                size_t at = 4;
                int64_t abort_at = -1;
                if (flags & 4) {
                    if (len < 8) {
                        reply('X', w);
                        break;
                    }
                    uint32_t a;
                    std::memcpy(&a, payload.data() + 4, 4);
                    abort_at = a;
                    at = 8;
                }
                std::vector<uint8_t> packet(payload.begin() + at, payload.end());
                auto r = h.run_token(packet, flags & 1, flags & 2, abort_at);
                w.u32(r.kind);
                w.u64(r.cycles);
                w.u64(r.wall_ns);
                w.u64(r.cpu_ns);
                w.u32(r.status);
                w.u32(r.cause);
                w.u32(r.where);
                w.u32(kNumCounters);
                for (int i = 0; i < kNumCounters; ++i) w.u64(r.counters[i]);
                w.u32(uint32_t(4 * h.out_words.size()));
                w.bytes(h.out_words.data(), 4 * h.out_words.size());
                w.u32(uint32_t(r.msg.size()));
                w.bytes(r.msg.data(), r.msg.size());
                if (flags & 8) w.u64(r.end_cycle);
                if ((flags & 2) && r.kind == 0) {
                    w.u32(uint32_t(h.profile.size() - 1));
                    for (size_t i = 1; i < h.profile.size(); ++i)
                        for (int k = 0; k < kNumCounters; ++k) w.u64(h.profile[i].v[k] - h.profile[i - 1].v[k]);
                }
                reply(r.kind ? 'E' : 'K', w);
                break;
            }
            case 'I': {
                std::vector<std::vector<uint8_t>> streams;
                size_t at = 0;
                bool ok = true;
                for (int c = 0; c < CHANNELS && ok; ++c) {
                    uint32_t n;
                    if (at + 4 > len) {
                        ok = false;
                        break;
                    }
                    std::memcpy(&n, payload.data() + at, 4);
                    at += 4;
                    if (at + n > len || n % kBeatBytes) {
                        ok = false;
                        break;
                    }
                    streams.emplace_back(payload.begin() + at, payload.begin() + at + n);
                    at += n;
                }
                if (!ok || at != len) {
                    reply('X', w);
                    break;
                }
                h.image = std::move(streams);
                reply('K', w);
                break;
            }
            case 'R':
                h.hard_reset();
                w.u64(h.cycle);
                reply('K', w);
                break;
            case 'r': {
                if (len != 4) {
                    reply('X', w);
                    break;
                }
                uint32_t addr;
                std::memcpy(&addr, payload.data(), 4);
                w.u32(h.axil_read(addr));
                reply('K', w);
                break;
            }
            case 'w': {
                if (len != 8) {
                    reply('X', w);
                    break;
                }
                uint32_t addr, data;
                std::memcpy(&addr, payload.data(), 4);
                std::memcpy(&data, payload.data() + 4, 4);
                h.axil_write(addr, data);
                reply('K', w);
                break;
            }
            case 'Q':
                reply('K', w);
                h.top->final();
                return 0;
            default:
                reply('X', w);
        }
    }
}
