/* Known call chain for the stack test: colibri_chain -> chain_mid -> chain_leaf (+ an external leaf),
 * colibri_recursive -> rec (recursive), colibri_indirect -> a function pointer. */
#define NOINLINE __attribute__((noinline))
volatile int sink;
NOINLINE int chain_leaf(int x) { volatile char b[100]; b[x & 7] = (char)x; sink = b[1]; return b[2]; }
NOINLINE int chain_mid(int x) { volatile char b[300]; b[x & 7] = (char)x; sink = b[3]; return chain_leaf(b[4]) + 1; }
NOINLINE int chain_other(int x) { volatile char b[20]; b[x & 3] = (char)x; return b[1]; }
int colibri_chain(int x) { volatile char b[40]; b[x & 7] = (char)x; return chain_mid(b[5]) + chain_other(x); }
NOINLINE int rec(int n) { volatile char b[16]; b[0] = (char)n; return n > 0 ? rec(n - 1) + b[0] : 0; }
int colibri_recursive(int n) { return rec(n) + 1; }
int (*volatile hook)(int);
int colibri_indirect(int n) { return hook(n) + 1; }
