#include "controller/cli/interrupt_note.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

namespace llmctl::cli {
namespace {

TEST(InterruptNoteDeathTest, CtrlCSaysTheNoteAndExits130) {
  EXPECT_EXIT(
      {
        InterruptNote note("experiment 7 goes on running: llmctl watch 7\n");
        ::raise(SIGINT);
      },
      ::testing::ExitedWithCode(130), "experiment 7 goes on running: llmctl watch 7");
}

// Once it ends, Ctrl-C does what it did before: here the default action, death by the signal.
TEST(InterruptNoteDeathTest, TheActionBeforeItIsRestored) {
  EXPECT_EXIT(
      {
        { InterruptNote note("not said\n"); }
        ::raise(SIGINT);
      },
      ::testing::KilledBySignal(SIGINT), ::testing::Not(::testing::HasSubstr("not said")));
}

}  // namespace
}  // namespace llmctl::cli
