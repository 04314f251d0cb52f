// Text anyone in a shared project can choose (a lease's or server's name, and so a node's) or the
// cloud writes (a status, Nova's fault), for the lease and node commands' tests: what reaches the
// terminal of it must carry none of its controls.
#ifndef LLMCTL_TESTS_OPENSTACK_SIM_HOSTILE_TEXT_H_
#define LLMCTL_TESTS_OPENSTACK_SIM_HOSTILE_TEXT_H_

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace llmctl::testing {

// An OSC title-setting escape ended by BEL, a newline that would forge a line, and U+009B (CSI as a
// C1 control) that would clear the screen.
inline constexpr char kHostile[] =
    "evil\x1b]0;pwned\x07\n\xc2\x9b"
    "2Jname";
// kHostile as printed: each control character one space.
inline constexpr char kHostileShown[] = "evil ]0;pwned   2Jname";

// No escape, BEL or C1 control of kHostile's in `text`, and its newline not kept either: wherever
// the text's end is, the rest of it comes before it on the same line.
inline void ExpectNoControlsFromTheCloud(const std::string& text) {
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find('\x07'), std::string::npos) << text;
  EXPECT_EQ(text.find("\xc2\x9b"), std::string::npos) << text;
  const std::string_view shown = kHostileShown;
  const std::string_view end = "2Jname";
  for (size_t at = text.find(end); at != std::string::npos; at = text.find(end, at + 1)) {
    const size_t begin = at + end.size() - shown.size();
    EXPECT_TRUE(at + end.size() >= shown.size() && text.compare(begin, shown.size(), shown) == 0)
        << text;
  }
}

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_OPENSTACK_SIM_HOSTILE_TEXT_H_
