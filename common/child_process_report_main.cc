// child_process_test's stand-in program: prints the signal its parent's death sends it
// (PR_GET_PDEATHSIG), which no file under /proc shows.
#include <sys/prctl.h>

#include <cstdio>

int main() {
  int signal = 0;
  if (::prctl(PR_GET_PDEATHSIG, &signal) != 0) return 1;
  std::printf("%d\n", signal);
  return 0;
}
