// The ECPIX-5 DDR3 token harness: hw.boards.dram_board.DRAMBoard (128-bit port, the accelerator core inside) on the
// LiteDRAM DDR3 simulation core through hw.boards.ecp5.Ddr3Crossings, two clocks, driven over pipes by
// sim/ddr3_token/__init__.py (Harness). Top module and ports: sim/ddr3_token/__init__.py (sim_top).
//
// Clocks: the core's `clk` and the controller's `dram_clk` with periods CORE_PERIOD and DRAM_PERIOD in one time
// unit (72 MHz and 75 MHz: 50 and 48 units of 1/3.6 GHz). Both resets are held for the first 16 core cycles.
// The link: `rx` takes one queued byte a core cycle while `rx.ready`; `tx.ready` is always 1 and every byte is
// queued for the host. The back door: DRAM bytes written into, or read from, the DDR3 model's bank arrays
// (BACKDOOR_BANKS, public through public.vlt) at the controller's mapping (ROW_BANK_COL: see word_place).
//
// Requests on stdin (little-endian), replies on stdout:
//   'W' n:u32 bytes[n]           queue link bytes (no reply)
//   'R' n:u32 budget:u64         run until n link bytes are queued for the host or `budget` core cycles passed;
//                                reply k:u32 bytes[k] (k <= n, taken from the queue)
//   'F'                          drop the queued host bytes (no reply)
//   'I' budget:u64               run until init_done (or budget core cycles); reply ok:u8 cycles:u64
//   'B' addr:u64 n:u64 bytes[n]  back-door write of DRAM bytes [addr, addr + n); reply 'b'
//   'D' addr:u64 n:u64           back-door read; reply bytes[n]
//   'M'                          mark: the read window (first and last DFI read) starts again
//   'N'                          counters: reply NCOUNTERS u64 (see counters())
//   'Q'                          quit
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <string>
#include <vector>
#include <sys/resource.h>
#include <unistd.h>
#include "verilated.h"
#include "Vddr3_token_sim.h"
#include "Vddr3_token_sim___024root.h"
#include "backdoor.h"   // BACKDOOR_BANKS(X): X(bank, root member) of the 8 bank arrays; MODEL_* geometry;
                        // MON_*: the 32-bit words of the `monitor` port (Verilator names `rx.valid` rx___05Fvalid)

static void die(const char* what) {
    fprintf(stderr, "harness: %s\n", what);
    exit(2);
}

static void read_all(void* buf, size_t n) {
    char* p = (char*)buf;
    while (n) {
        ssize_t r = read(0, p, n);
        if (r <= 0) exit(r == 0 ? 0 : 3);
        p += r; n -= (size_t)r;
    }
}

static void write_all(const void* buf, size_t n) {
    const char* p = (const char*)buf;
    while (n) {
        ssize_t r = write(1, p, n);
        if (r <= 0) die("stdout closed");
        p += r; n -= (size_t)r;
    }
}

template <typename T> static T get() { T v; read_all(&v, sizeof v); return v; }

static uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

static uint64_t cpu_ns() {
    timespec ts; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct Sim {
    VerilatedContext* ctx;
    Vddr3_token_sim* top;
    uint64_t core_half, dram_half;        // half periods, time units
    uint64_t next_core = 0, next_dram = 0;
    uint64_t core_cycles = 0, dram_cycles = 0;
    std::deque<uint8_t> rx, tx;
    uint64_t rx_bytes = 0, tx_bytes = 0;
    uint32_t last_rd = 0;
    uint64_t rd_first = 0, rd_last = 0;   // controller cycles of the first and last DFI read since the mark
    bool rd_seen = false;
    uint64_t sim_ns = 0, sim_cpu_ns = 0;

    Sim(uint64_t core_period, uint64_t dram_period) {
        if (core_period % 2 || dram_period % 2) die("periods must be even");
        core_half = core_period / 2; dram_half = dram_period / 2;
        ctx = new VerilatedContext;
        top = new Vddr3_token_sim{ctx};
        top->clk = 0; top->dram_clk = 0; top->rst = 1; top->dram_rst = 1;
        top->rx___05Fvalid = 0; top->rx___05Fpayload = 0; top->tx___05Fready = 1;
        top->eval();
        next_core = core_half; next_dram = dram_half;
        for (int i = 0; i < 16; i++) edge_until_core_rise();
        top->rst = 0; top->dram_rst = 0;
    }

    // One clock event (either clock's edge, or both); returns true on a rising core edge.
    bool edge() {
        uint64_t t = next_core < next_dram ? next_core : next_dram;
        bool core_rise = false, dram_rise = false;
        if (next_core == t) {
            if (!top->clk) {                // the core's rising edge: the link's handshakes happen here
                core_rise = true;
                if (top->tx___05Fvalid) { tx.push_back((uint8_t)top->tx___05Fpayload); tx_bytes++; }
                if (top->rx___05Fvalid && top->rx___05Fready) { rx.pop_front(); rx_bytes++; }
            }
            top->clk = !top->clk; next_core += core_half;
        }
        if (next_dram == t) {
            dram_rise = !top->dram_clk;
            top->dram_clk = !top->dram_clk; next_dram += dram_half;
        }
        top->eval();
        if (core_rise) {
            core_cycles++;
            top->rx___05Fvalid = !rx.empty();
            top->rx___05Fpayload = rx.empty() ? 0 : rx.front();
        }
        if (dram_rise) {
            dram_cycles++;
            uint32_t rd = top->monitor[MON_RD];
            if (rd != last_rd) {
                if (!rd_seen) { rd_first = dram_cycles; rd_seen = true; }
                rd_last = dram_cycles;
                last_rd = rd;
            }
        }
        return core_rise;
    }

    void edge_until_core_rise() { while (!edge()) {} }

    void run_cycles_until(uint64_t budget, size_t want_tx) {
        uint64_t t0 = now_ns(), c0 = cpu_ns(), start = core_cycles;
        while (tx.size() < want_tx && core_cycles - start < budget) edge_until_core_rise();
        sim_ns += now_ns() - t0; sim_cpu_ns += cpu_ns() - c0;
    }
};

// The controller's mapping (LiteDRAM ROW_BANK_COL, address_align 3 for DDR3 BL8): port word w has column
// (w mod 2^COLW) << 3, bank (w >> COLW) mod 8, row w >> (COLW + 3); the model (litedram.phy.model.BankModel) keeps
// the burst at index (row * ncols | col) >> log2(burst_length * nphases) of that bank's array.
static inline void word_place(uint64_t w, unsigned& bank, uint64_t& index) {
    uint64_t col = (w & ((1ull << MODEL_COLW) - 1)) << MODEL_ALIGN;
    bank = (unsigned)((w >> MODEL_COLW) & ((1u << MODEL_BANKBITS) - 1));
    uint64_t row = w >> (MODEL_COLW + MODEL_BANKBITS);
    index = (row * MODEL_NCOLS | col) >> MODEL_INDEX_SHIFT;
}

static uint32_t* bank_word(Vddr3_token_sim___024root* r, unsigned bank, uint64_t index) {
    switch (bank) {
#define X(b, member) case b: return &r->member[index][0];
        BACKDOOR_BANKS(X)
#undef X
    }
    die("bank out of range");
    return nullptr;
}

static void backdoor(Sim& s, uint64_t addr, uint64_t n, uint8_t* buf, bool write) {
    if (addr + n > (uint64_t)MODEL_BYTES) die("back door beyond the DRAM");
    Vddr3_token_sim___024root* r = s.top->rootp;
    uint64_t a = addr, end = addr + n;
    while (a < end) {
        uint64_t w = a >> 4; unsigned off = (unsigned)(a & 15);
        unsigned take = (unsigned)((end - a) < (uint64_t)(16 - off) ? (end - a) : (16 - off));
        unsigned bank; uint64_t index;
        word_place(w, bank, index);
        uint8_t* word = (uint8_t*)bank_word(r, bank, index);   // 4 x 32-bit words, little-endian host
        if (write) memcpy(word + off, buf + (a - addr), take);
        else memcpy(buf + (a - addr), word + off, take);
        a += take;
    }
}

int main(int argc, char** argv) {
    uint64_t core_period = 50, dram_period = 48;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--core-period") core_period = strtoull(argv[i + 1], nullptr, 0);
        else if (k == "--dram-period") dram_period = strtoull(argv[i + 1], nullptr, 0);
        else die("unknown argument");
    }
    uint64_t t0 = now_ns();
    Sim s(core_period, dram_period);
    uint64_t construct_ns = now_ns() - t0;
    std::vector<uint8_t> buf;
    for (;;) {
        uint8_t cmd = get<uint8_t>();
        if (cmd == 'W') {
            uint32_t n = get<uint32_t>();
            buf.resize(n); read_all(buf.data(), n);
            for (uint32_t i = 0; i < n; i++) s.rx.push_back(buf[i]);
            if (!s.top->rx___05Fvalid && !s.rx.empty()) {   // visible at the next edge
                s.top->rx___05Fvalid = 1; s.top->rx___05Fpayload = s.rx.front(); s.top->eval();
            }
        } else if (cmd == 'R') {
            uint32_t n = get<uint32_t>(); uint64_t budget = get<uint64_t>();
            s.run_cycles_until(budget, n);
            uint32_t k = (uint32_t)(s.tx.size() < n ? s.tx.size() : n);
            buf.resize(k);
            for (uint32_t i = 0; i < k; i++) { buf[i] = s.tx.front(); s.tx.pop_front(); }
            write_all(&k, 4); write_all(buf.data(), k);
        } else if (cmd == 'F') {
            s.tx.clear();
        } else if (cmd == 'I') {
            uint64_t budget = get<uint64_t>(), start = s.core_cycles;
            uint64_t w0 = now_ns(), c0 = cpu_ns();
            while (!s.top->init_done && s.core_cycles - start < budget) s.edge_until_core_rise();
            s.sim_ns += now_ns() - w0; s.sim_cpu_ns += cpu_ns() - c0;
            uint8_t ok = s.top->init_done; uint64_t c = s.core_cycles;
            write_all(&ok, 1); write_all(&c, 8);
        } else if (cmd == 'B' || cmd == 'D') {
            uint64_t addr = get<uint64_t>(), n = get<uint64_t>();
            const uint64_t chunk = 1ull << 24;
            for (uint64_t done = 0; done < n; done += chunk) {
                uint64_t m = n - done < chunk ? n - done : chunk;
                buf.resize(m);
                if (cmd == 'B') { read_all(buf.data(), m); backdoor(s, addr + done, m, buf.data(), true); }
                else { backdoor(s, addr + done, m, buf.data(), false); write_all(buf.data(), m); }
            }
            if (cmd == 'B') { uint8_t ack = 'b'; write_all(&ack, 1); }
        } else if (cmd == 'M') {
            s.rd_seen = false; s.rd_first = s.rd_last = 0;
        } else if (cmd == 'N') {
            struct rusage ru; getrusage(RUSAGE_SELF, &ru);
            uint64_t c[] = {s.core_cycles, s.dram_cycles, s.top->monitor[MON_REF], s.top->monitor[MON_ACT],
                            s.top->monitor[MON_PRE], s.top->monitor[MON_RD], s.top->monitor[MON_WR],
                            s.top->monitor[MON_REF_MAX_GAP], s.rd_first, s.rd_last, s.rx_bytes, s.tx_bytes,
                            s.sim_ns, s.sim_cpu_ns, construct_ns, (uint64_t)ru.ru_maxrss, s.top->init_done,
                            s.top->init_error, (uint64_t)s.rx.size(), (uint64_t)s.tx.size()};
            write_all(c, sizeof c);
        } else if (cmd == 'Q') {
            break;
        } else {
            die("unknown request");
        }
    }
    s.top->final();
    delete s.top;
    delete s.ctx;
    return 0;
}
