// Verilator harness of the mmfree core (hw.top.Accelerator exported by hw/export.py as `mmfree_core`).
//
// The stimulus lives here, not in Python: the model image is loaded once into memory (one byte stream
// per weight channel, built by host/devices/rtl.py), and every token is driven at full rate (tvalid high
// every cycle, respecting tready): channel 0 carries the token packet (tlast on its last beat) then its
// image stream (tlast on its last beat), channel c > 0 its weight blocks (tlast on the last beat). The
// output stream (m_axis_out, 32-bit) is always ready. Registers are reached through a small AXI4-Lite
// manager (one transaction at a time, ARM IHI 0022E chapter B1).
//
// Build (host/devices/rtl_harness.py does this):
//   verilator --cc --exe --build -DCHANNELS=C -DBUS_BITS=B ... mmfree_core.v harness.cpp
//
// Usage: harness [--hang-cycles N] [--fst PATH] CH0_FILE [CH1_FILE ...]
// (--fst names the waveform file of a trace build: FST with --trace-fst, VCD with --trace.)
//
// Protocol (stdin -> stdout, little-endian; one reply per request):
//   request  = u8 command, u32 length, payload[length]
//   reply    = u8 code ('K' ok, 'E' token failed, 'X' bad request), u32 length, payload[length]
//   'T'  run a token.   payload: u32 flags (bit 0: dump a waveform of this token, bit 1: profile it per
//        instruction), token packet bytes.
//        reply payload: u32 kind (0 ok, 1 core error, 2 timeout), u64 cycles, u64 wall_ns, u64 cpu_ns,
//                       u32 status, u32 error_cause, u32 error_where, u32 n_counters,
//                       n_counters x u64 (counter increments of this token, hw.isa.Counter order),
//                       u32 out_len, out bytes (the output packet), u32 msg_len, msg (what went wrong),
//                       and when profiled: u32 n_instr, n_instr x n_counters x u64 (increments per instruction)
//   'R'  hard reset (rst for 4 cycles): zeroes the recurrent state and the counters.  reply: u64 cycle
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
#include <type_traits>
#include <utility>
#include <vector>

#include "Vmmfree_core.h"
#include "Vmmfree_core___024root.h"
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
static constexpr uint32_t kStatus = 0x44, kErrorCause = 0x48, kErrorWhere = 0x4C, kCtrl = 0x40;
static constexpr uint32_t kCounters = 0x80;
static constexpr int kNumCounters = 12;   // hw.isa.Counter

// The core's counter registers, in hw.isa.Counter order (readable thanks to public.vlt): the per-instruction
// profile snapshots them at instruction boundaries without disturbing the core.
#define CTR(name) top->rootp->mmfree_core__DOT__counter_##name
#define ALL_COUNTERS(X) \
    X(cycles) X(stream_beats) X(stream_stalls) X(out_stalls) X(gemv_cycles) X(quant_cycles) X(scalar_cycles) \
    X(trits) X(nonzero_trits) X(epilogue_elements) X(instructions) X(tokens)

// ---------------------------------------------------------------------------------------- tdata
static inline void set_tdata(QData& port, const uint8_t* p) { std::memcpy(&port, p, 8); }
template <std::size_t N>
static inline void set_tdata(VlWide<N>& port, const uint8_t* p) {
    for (std::size_t i = 0; i < N; ++i) {
        uint32_t w;
        std::memcpy(&w, p + 4 * i, 4);
        port[i] = w;
    }
}

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
    size_t total() const { return seg[0].beats + (nseg > 1 ? seg[1].beats : 0); }
    size_t taken() const {
        size_t t = 0;
        for (int i = 0; i < cur && i < nseg; ++i) t += seg[i].beats;
        return t + (done() ? 0 : pos);
    }
};

// Verilator spells Amaranth's "__" port separator "___05F"
#define AXIL(x) s_axil___05F##x
#define OUTS(x) m_axis_out___05F##x
#define AXIS(c, x) s_axis_w##c##___05F##x
#define CH_PORTS(c) {&top->AXIS(c, tdata), &top->AXIS(c, tvalid), &top->AXIS(c, tlast), &top->AXIS(c, tready)}

template <typename TData>
struct ChannelPorts {  // the core's s_axis_w<c> ports
    TData* tdata;
    CData* tvalid;
    CData* tlast;
    CData* tready;
};

struct Harness {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vmmfree_core> top;
    std::vector<std::vector<uint8_t>> image;     // per channel
    Feed feed[CHANNELS];
    using Ports = ChannelPorts<std::remove_reference_t<decltype(std::declval<Vmmfree_core&>().AXIS(0, tdata))>>;
    Ports ch[CHANNELS];
    uint64_t cycle = 0;
    uint64_t base[kNumCounters] = {};
    uint64_t hang_cycles = 100000;
    std::string fst_path;
#if VM_TRACE
    std::unique_ptr<TraceFile> fst;
#endif

    // per-token bookkeeping of the stream tick
    std::vector<uint32_t> out_words;
    bool out_last = false;
    bool progress = false;

    Harness() : ctx(new VerilatedContext) {
#if VM_TRACE
        ctx->traceEverOn(true);
#endif
        top.reset(new Vmmfree_core{ctx.get()});
        Ports ports[] = {
            CH_PORTS(0),
#if CHANNELS > 1
            CH_PORTS(1),
#endif
#if CHANNELS > 2
            CH_PORTS(2),
#endif
#if CHANNELS > 3
            CH_PORTS(3),
#endif
        };
        for (int c = 0; c < CHANNELS; ++c) ch[c] = ports[c];
        top->OUTS(tready) = 1;
        top->clk = 0;
        top->eval();
    }

    // One clock cycle: inputs as set, settle, sample the transfers, rising edge, advance the feeds.
    void tick(bool streams) {
        if (streams) {
            for (int c = 0; c < CHANNELS; ++c) {
                Feed& f = feed[c];
                if (!f.done()) {
                    set_tdata(*ch[c].tdata, f.beat());
                    *ch[c].tvalid = 1;
                    *ch[c].tlast = f.last();
                } else {
                    *ch[c].tvalid = 0;
                    *ch[c].tlast = 0;
                }
            }
        }
        top->clk = 0;
        top->eval();
        bool taken[CHANNELS];
        bool any = false;
        for (int c = 0; c < CHANNELS; ++c) {
            taken[c] = *ch[c].tvalid && *ch[c].tready;
            any |= taken[c];
        }
        if (top->OUTS(tvalid) && top->OUTS(tready)) {
            out_words.push_back(top->OUTS(tdata));
            if (top->OUTS(tlast)) out_last = true;
            any = true;
        }
#if VM_TRACE
        if (fst) fst->dump(2 * cycle);
#endif
        top->clk = 1;
        top->eval();
#if VM_TRACE
        if (fst) fst->dump(2 * cycle + 1);
#endif
        ++cycle;
        progress = any;
        if (streams)
            for (int c = 0; c < CHANNELS; ++c)
                if (taken[c]) feed[c].advance();
    }

    void idle_streams() {
        for (int c = 0; c < CHANNELS; ++c) {
            *ch[c].tvalid = 0;
            *ch[c].tlast = 0;
        }
    }

    // ------------------------------------------------------------------ AXI4-Lite manager
    uint32_t axil_read(uint32_t addr) {
        top->AXIL(araddr) = addr;
        top->AXIL(arprot) = 0;
        top->AXIL(arvalid) = 1;
        top->AXIL(rready) = 1;
        bool addr_done = false;
        uint32_t data = 0;
        for (int i = 0; i < 64; ++i) {
            top->clk = 0;
            top->eval();
            bool a = top->AXIL(arvalid) && top->AXIL(arready);
            bool r = top->AXIL(rvalid) && top->AXIL(rready);
            if (r) data = top->AXIL(rdata);
            top->clk = 1;
            top->eval();
            ++cycle;
            if (a) {
                addr_done = true;
                top->AXIL(arvalid) = 0;
            }
            if (r && addr_done) {
                top->AXIL(rready) = 0;
                return data;
            }
        }
        std::fprintf(stderr, "harness: AXI4-Lite read of 0x%x got no response\n", addr);
        std::exit(3);
    }

    void axil_write(uint32_t addr, uint32_t data) {
        top->AXIL(awaddr) = addr;
        top->AXIL(awprot) = 0;
        top->AXIL(awvalid) = 1;
        top->AXIL(wdata) = data;
        top->AXIL(wstrb) = 0xF;
        top->AXIL(wvalid) = 1;
        top->AXIL(bready) = 1;
        for (int i = 0; i < 64; ++i) {
            top->clk = 0;
            top->eval();
            bool aw = top->AXIL(awvalid) && top->AXIL(awready);
            bool w = top->AXIL(wvalid) && top->AXIL(wready);
            bool b = top->AXIL(bvalid) && top->AXIL(bready);
            top->clk = 1;
            top->eval();
            ++cycle;
            if (aw) top->AXIL(awvalid) = 0;
            if (w) top->AXIL(wvalid) = 0;
            if (b) {
                top->AXIL(bready) = 0;
                return;
            }
        }
        std::fprintf(stderr, "harness: AXI4-Lite write of 0x%x got no response\n", addr);
        std::exit(3);
    }

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
        top->AXIL(arvalid) = 0;
        top->AXIL(awvalid) = 0;
        top->AXIL(wvalid) = 0;
        top->rst = 1;
        for (int i = 0; i < 4; ++i) tick(false);
        top->rst = 0;
        tick(false);
        std::memset(base, 0, sizeof base);
    }

    // ------------------------------------------------------------------ one token
    struct Result {
        uint32_t kind = 0, status = 0, cause = 0, where = 0;
        uint64_t cycles = 0, wall_ns = 0, cpu_ns = 0;
        uint64_t counters[kNumCounters] = {};
        std::string msg;
    };

    Result run_token(const std::vector<uint8_t>& packet, bool dump, bool prof) {
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
        bool first_taken = false;
        uint64_t first_cycle = 0;
        while (!out_last) {
            tick(true);
            if (progress) last_progress = cycle;
            if (prof && CTR(instructions) != instr_seen) {
                instr_seen = CTR(instructions);
                profile.push_back(snapshot());
            }
            if (!first_taken && feed[0].taken() > 0) {
                first_taken = true;
                first_cycle = cycle;
            }
            // irq = done | error; `done` of the previous token clears two cycles after the first word
            if (first_taken && cycle - first_cycle > 4 && top->irq) {
                idle_streams();   // no beat may be taken while the register reads clock the core
                uint32_t st = axil_read(kStatus);
                if (st & 4) {
                    res.kind = 1;
                    res.status = st;
                    res.cause = axil_read(kErrorCause);
                    res.where = axil_read(kErrorWhere);
                    res.msg = "the core stopped the token (STATUS.error) at channel 0 beat " +
                              std::to_string(feed[0].taken()) + " of " + std::to_string(feed[0].total());
                    axil_write(kCtrl, 1);   // CTRL.clear: back to waiting for a token packet
                    idle_streams();
                    for (int i = 0; i < 4; ++i) tick(false);
                    break;
                }
            }
            if (cycle - last_progress > hang_cycles) {
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
                res.kind = 2;
                res.msg = "runaway output stream (more than 4 M words without tlast); core reset";
                hard_reset();
                break;
            }
        }
        idle_streams();
        if (res.kind == 0) {
            // the commit (done) follows the trailer's last word within a few cycles
            for (int i = 0; i < 16 && !top->irq; ++i) tick(false);
            tick(false);
            tick(false);
            res.cycles = cycle - start;
            if (prof) profile.push_back(snapshot());   // closes END_TOKEN (not counted in INSTRUCTIONS)
            res.status = axil_read(kStatus);
            for (int i = 0; i < kNumCounters; ++i) {
                uint64_t v = read_counter(i);
                res.counters[i] = v - base[i];
                base[i] = v;
            }
        } else {
            res.cycles = cycle - start;
            if (res.kind == 1)
                for (int i = 0; i < kNumCounters; ++i) {
                    uint64_t v = read_counter(i);
                    res.counters[i] = v - base[i];
                    base[i] = v;
                }
        }
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
                std::vector<uint8_t> packet(payload.begin() + 4, payload.end());
                auto r = h.run_token(packet, flags & 1, flags & 2);
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
                if ((flags & 2) && r.kind == 0) {
                    w.u32(uint32_t(h.profile.size() - 1));
                    for (size_t i = 1; i < h.profile.size(); ++i)
                        for (int k = 0; k < kNumCounters; ++k) w.u64(h.profile[i].v[k] - h.profile[i - 1].v[k]);
                }
                reply(r.kind ? 'E' : 'K', w);
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
