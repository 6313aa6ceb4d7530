// cudaemu runtime: fibers, the scheduler and the checked rendezvous points
// (see cudaemu.h).  Compiled once into the emulated build.
#include "cudaemu.h"

#include <algorithm>
#include <cstdarg>
#include <map>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CUDAEMU_ASAN 1
#else
#define CUDAEMU_ASAN 0
#endif

namespace cudaemu {

State g_state;

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kStaticSharedLimit = 48 * 1024;

// ---- context switch ------------------------------------------------------------
// swapcontext costs a sigprocmask system call per switch (~0.35 us); the
// backward kernel switches tens of millions of times.  On x86-64 a switch only
// has to save the callee-saved registers (rbx, rbp, r12-r15), MXCSR and the
// x87 control word (System V ABI), swap stack pointers and return: ~10x less.
#if CUDAEMU_ASM_SWITCH
extern "C" __attribute__((visibility("hidden"))) void cudaemu_swap(void** save_sp, void* new_sp);
asm(R"(
    .text
    .p2align 4
    .globl cudaemu_swap
    .hidden cudaemu_swap
    .type cudaemu_swap, @function
cudaemu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudaemu_swap, .-cudaemu_swap
)");

void switch_context(Context& from, Context& to) { cudaemu_swap(&from.sp, to.sp); }

// A fresh stack that cudaemu_swap "returns" into `entry`, with the stack
// aligned as after a call (rsp = 8 mod 16) and a null return address above.
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top) - 11;  // = 8 mod 16: rsp = 8 mod 16 at entry
  uint32_t csr[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
  std::memcpy(&sp[0], csr, 8);                  // MXCSR, x87 control word
  for (int i = 1; i <= 6; ++i) sp[i] = 0;       // r15 r14 r13 r12 rbx rbp
  sp[7] = reinterpret_cast<uint64_t>(entry);    // ret -> entry
  sp[8] = 0;                                    // entry's (null) return address
  sp[9] = sp[10] = 0;
  c.sp = sp;
}
#else
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// Fiber -> scheduler.
void yield_to_scheduler(bool dying) {
  State& s = g_state;
  Fiber* f = s.cur;
#if CUDAEMU_ASAN
  __sanitizer_start_switch_fiber(dying ? nullptr : &f->asan_fake, s.asan_sched_bottom,
                                 s.asan_sched_size);
#endif
  (void)dying;
  switch_context(f->ctx, s.sched);
#if CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(f->asan_fake, &s.asan_sched_bottom, &s.asan_sched_size);
#endif
}

void fiber_entry() {
  State& s = g_state;
#if CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.asan_sched_bottom, &s.asan_sched_size);
#endif
  s.body();
  s.cur->wait = Wait::Done;
  yield_to_scheduler(true);
  std::abort();  // a finished fiber is never resumed
}

void arrange(std::vector<int>& v, int n, Order o, std::mt19937& rng) {
  if (int(v.size()) != n || o == Order::Random) {
    v.resize(n);
    for (int i = 0; i < n; ++i) v[i] = o == Order::Reverse ? n - 1 - i : i;
    if (o == Order::Random) std::shuffle(v.begin(), v.end(), rng);
  }
}

std::string where(const Fiber& f) {
  return std::string(f.what) + " at " + base_name(f.file) + ":" + std::to_string(f.line);
}

std::string block_name(const State& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "block (%u, %u, %u) of the launch at %s:%d", s.block_idx.x,
                s.block_idx.y, s.block_idx.z, base_name(s.launch_file), s.launch_line);
  return buf;
}

// Releases the warp collectives and the block barrier that every participant
// has reached.  Returns true when something was released; records a failure
// (s.failed) on a mismatch.
bool resolve(State& s) {
  const int n = int(s.fibers.size());
  bool released = false;
  for (int w0 = 0; w0 < n; w0 += 32) {
    const int lanes = std::min(32, n - w0);
    int first = -1;
    for (int l = 0; l < lanes; ++l)
      if (s.fibers[w0 + l].wait == Wait::Warp) {
        first = l;
        break;
      }
    if (first < 0) continue;
    const Fiber& lead = s.fibers[w0 + first];
    const unsigned mask = lead.mask;
    bool complete = true;
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      if (l >= lanes) {
        fail("%s in %s: the mask 0x%08x names lane %d, which does not exist (partial warp)",
             where(lead).c_str(), block_name(s).c_str(), mask, l);
        return false;
      }
      const Fiber& f = s.fibers[w0 + l];
      if (f.wait == Wait::Done) {
        fail("%s in %s: lane %d of the mask 0x%08x has already exited", where(lead).c_str(),
             block_name(s).c_str(), l, mask);
        return false;
      }
      if (f.wait != Wait::Warp) {
        complete = false;
        continue;
      }
      if (f.mask != mask || f.line != lead.line || f.file != lead.file || f.what != lead.what) {
        fail("warp collective mismatch in %s: lanes wait at %s (mask 0x%08x) and %s (mask 0x%08x)",
             block_name(s).c_str(), where(lead).c_str(), mask, where(f).c_str(), f.mask);
        return false;
      }
    }
    if (!complete) continue;
    for (int l = 0; l < lanes; ++l) {
      const Fiber& f = s.fibers[w0 + l];
      if (f.wait == Wait::Warp && !(mask >> l & 1u)) {
        fail("warp collective mismatch in %s: lane %d waits at %s, outside the mask 0x%08x of %s",
             block_name(s).c_str(), l, where(f).c_str(), mask, where(lead).c_str());
        return false;
      }
    }
    uint64_t* table = &s.warp_tables[size_t(w0 / 32) * 32];
    for (int l = 0; l < lanes; ++l) table[l] = s.fibers[w0 + l].value;
    for (int l = 0; l < lanes; ++l) {
      Fiber& f = s.fibers[w0 + l];
      if (f.wait != Wait::Warp) continue;
      f.table = table;
      f.wait = Wait::Ready;
    }
    released = true;
  }
  // Block barrier: every live fiber waits at it.
  int live = 0, at_block = 0, first = -1;
  for (int i = 0; i < n; ++i) {
    const Wait w = s.fibers[i].wait;
    if (w == Wait::Done) continue;
    ++live;
    if (w == Wait::Block) {
      ++at_block;
      if (first < 0) first = i;
    }
  }
  if (live && at_block == live) {
    const Fiber& lead = s.fibers[first];
    uint64_t count = 0, all = 1, any = 0;
    for (auto& f : s.fibers) {
      if (f.wait != Wait::Block) continue;
      if (f.line != lead.line || f.file != lead.file || f.what != lead.what) {
        fail("divergent barrier in %s: threads wait at %s and at %s", block_name(s).c_str(),
             where(lead).c_str(), where(f).c_str());
        return false;
      }
      count += f.pred != 0;
      all &= f.pred != 0;
      any |= f.pred != 0;
    }
    const uint64_t result = !std::strcmp(lead.what, "__syncthreads_and")  ? all
                            : !std::strcmp(lead.what, "__syncthreads_or") ? any
                                                                          : count;
    for (auto& f : s.fibers) {
      if (f.wait != Wait::Block) continue;
      f.result = result;
      f.wait = Wait::Ready;
    }
    released = true;
  }
  return released;
}

void report_deadlock(State& s) {
  std::map<std::string, int> sites;
  for (auto& f : s.fibers)
    if (f.wait != Wait::Done) ++sites[where(f)];
  std::string list;
  for (auto& [site, count] : sites)
    list += (list.empty() ? "" : "; ") + std::to_string(count) + " thread(s) at " + site;
  fail("deadlock in %s: %s", block_name(s).c_str(), list.c_str());
}

// Returns false when the launch failed.
bool run_block(State& s) {
  const int n = int(s.block_dim.x * s.block_dim.y * s.block_dim.z);
  s.fibers.resize(n);
  s.warp_tables.assign(size_t((n + 31) / 32) * 32, 0);
  for (int i = 0; i < n; ++i) {
    Fiber& f = s.fibers[i];
    if (!f.stack) f.stack = static_cast<char*>(std::malloc(kStackBytes));
    f.linear = i;
    f.tid = uint3{unsigned(i % s.block_dim.x), unsigned(i / s.block_dim.x % s.block_dim.y),
                  unsigned(i / (s.block_dim.x * s.block_dim.y))};
    f.wait = Wait::Ready;
    f.what = "exit";
    f.file = "";
    f.line = 0;
    make_context(f.ctx, f.stack, kStackBytes, fiber_entry);
  }
  ++s.block_serial;
  ++s.stats.blocks;
  s.block_smem = 0;
  int live = n;
  while (live > 0) {
    bool ran = false;
    arrange(s.order, n, s.thread_order, s.rng);
    for (int i : s.order) {
      Fiber& f = s.fibers[i];
      if (f.wait != Wait::Ready) continue;
      s.cur = &f;
      ++s.stats.switches;
#if CUDAEMU_ASAN
      void* fake = nullptr;
      __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
#endif
      switch_context(s.sched, f.ctx);
#if CUDAEMU_ASAN
      __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
      s.cur = nullptr;
      if (s.failed) return false;
      ran = true;
      if (f.wait == Wait::Done) --live;
    }
    if (live == 0) break;
    const bool released = resolve(s);
    if (s.failed) return false;
    if (!ran && !released) {
      report_deadlock(s);
      return false;
    }
  }
  return true;
}

Order parse_order(const char* v, const char* name) {
  if (!v || !std::strcmp(v, "fwd")) return Order::Forward;
  if (!std::strcmp(v, "rev")) return Order::Reverse;
  if (!std::strcmp(v, "rand")) return Order::Random;
  std::fprintf(stderr, "cudaemu: bad %s=%s (fwd|rev|rand)\n", name, v);
  std::abort();
}

}  // namespace

void configure(Order thread_order, Order block_order, int poison, unsigned seed) {
  State& s = g_state;
  s.thread_order = thread_order;
  s.block_order = block_order;
  s.poison = poison;
  s.rng.seed(seed);
  s.order.clear();
}

void fail(const char* fmt, ...) {
  State& s = g_state;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (!s.failed) {  // keep the first failure of a launch
    s.message = std::string("cudaemu: ") + buf;
    std::fprintf(stderr, "%s\n", s.message.c_str());
  }
  s.failed = true;
  if (s.cur) {  // in a kernel: abandon this fiber (its stack is reset by the next block)
    s.cur->wait = Wait::Done;
    yield_to_scheduler(true);
    std::abort();
  }
}

void outside_kernel(const char* what) {
  std::fprintf(stderr, "cudaemu: %s used outside a kernel\n", what);
  std::abort();
}

void run_grid(dim3 grid, dim3 block) {
  State& s = g_state;
  if (s.cur) outside_kernel("a kernel launch from a kernel (dynamic parallelism)");
  ++s.stats.launches;
  s.failed = false;
  s.grid_dim = grid;
  s.block_dim = block;
  const int64_t nblocks = int64_t(grid.x) * grid.y * grid.z;
  std::vector<int64_t> order(nblocks);
  for (int64_t b = 0; b < nblocks; ++b) order[b] = b;
  if (s.block_order == Order::Reverse) std::reverse(order.begin(), order.end());
  if (s.block_order == Order::Random) std::shuffle(order.begin(), order.end(), s.rng);
  for (int64_t b : order) {
    s.block_idx = uint3{unsigned(b % grid.x), unsigned(b / grid.x % grid.y),
                        unsigned(b / (int64_t(grid.x) * grid.y))};
    if (!run_block(s)) {
      s.last_error = cudaErrorLaunchFailure;
      s.failed = false;
      return;
    }
  }
}

void shared_decl(void* p, size_t bytes, const char* file, int line) {
  struct Var {
    const void* p;
    uint64_t serial;
  };
  static std::vector<Var> vars;
  State& s = g_state;
  auto it = std::find_if(vars.begin(), vars.end(), [p](const Var& v) { return v.p == p; });
  if (it == vars.end()) {
    vars.push_back(Var{p, 0});
    it = vars.end() - 1;
  }
  if (it->serial == s.block_serial) return;  // already poisoned for this block
  it->serial = s.block_serial;
  std::memset(p, s.poison, bytes);
  s.block_smem += bytes;
  if (s.block_smem > kStaticSharedLimit)
    fail("static shared memory of %s is %zu bytes at %s:%d, over the 48 KiB limit",
         block_name(s).c_str(), s.block_smem, base_name(file), line);
}

uint64_t block_barrier(const char* what, const char* file, int line, int pred) {
  Fiber& f = self();
  f.wait = Wait::Block;
  f.what = what;
  f.file = file;
  f.line = line;
  f.pred = pred;
  yield_to_scheduler(false);
  return f.result;
}

const uint64_t* warp_exchange(const char* what, const char* file, int line, unsigned mask,
                              uint64_t value) {
  Fiber& f = self();
  const int lane = f.linear & 31;
  if (!(mask >> lane & 1u))
    fail("%s at %s:%d in %s: the calling lane %d is not in the mask 0x%08x", what,
         base_name(file), line, block_name(g_state).c_str(), lane, mask);
  f.wait = Wait::Warp;
  f.what = what;
  f.file = file;
  f.line = line;
  f.mask = mask;
  f.value = value;
  yield_to_scheduler(false);
  return f.table;
}

}  // namespace cudaemu

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchFailure: return cudaemu::g_state.message.c_str();
  }
  return "unknown cuda error";
}
