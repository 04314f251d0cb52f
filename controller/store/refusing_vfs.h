// For tests: a database file that cannot be written for a while (re-permissioned, removed, on a
// filesystem remounted read-only or failing), without root. RefusingVfs is a SQLite VFS that the
// process uses by default while it lives (a Store opened meanwhile goes through it) and passes
// every call on to the VFS it replaced, except that while Refuse(rc) holds every write to a file
// fails with `rc`: SQLITE_READONLY, SQLITE_IOERR_WRITE, ... Reads go on. One at a time in a
// process; the files opened through it are closed before it is destroyed.
#ifndef LLMCTL_CONTROLLER_STORE_REFUSING_VFS_H_
#define LLMCTL_CONTROLLER_STORE_REFUSING_VFS_H_

#include <sqlite3.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace llmctl::store::test_support {

class RefusingVfs {
 public:
  RefusingVfs() : base_(sqlite3_vfs_find(nullptr)) {
    // The base's own fields (pAppData, mxPathname) stay: its other functions are called with this
    // VFS. Each file is the base's, followed by the io methods the base gave it.
    vfs_ = *base_;
    vfs_.pNext = nullptr;
    vfs_.zName = "llmctl-refusing";
    vfs_.szOsFile = base_->szOsFile + static_cast<int>(sizeof(const sqlite3_io_methods*));
    vfs_.xOpen = &Open;
    current_ = this;
    sqlite3_vfs_register(&vfs_, /*makeDflt=*/1);
  }
  ~RefusingVfs() {
    sqlite3_vfs_unregister(&vfs_);
    sqlite3_vfs_register(base_, /*makeDflt=*/1);
    current_ = nullptr;
  }
  RefusingVfs(const RefusingVfs&) = delete;
  RefusingVfs& operator=(const RefusingVfs&) = delete;

  // Every write fails with `rc` until Accept().
  void Refuse(int rc) { refusal_ = rc; }
  void Accept() { refusal_ = SQLITE_OK; }
  // How many writes were refused.
  int RefusedWrites() const { return refused_writes_; }

 private:
  static int Open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file, int flags,
                  int* out_flags) {
    RefusingVfs& self = *current_;
    const int rc = self.base_->xOpen(self.base_, name, file, flags, out_flags);
    if (file->pMethods == nullptr) return rc;  // nothing opened
    std::memcpy(BaseMethodsSlot(file), &file->pMethods, sizeof(file->pMethods));
    file->pMethods = self.MethodsFor(file->pMethods);
    return rc;
  }
  static int Write(sqlite3_file* file, const void* data, int amount, sqlite3_int64 offset) {
    RefusingVfs& self = *current_;
    if (const int refusal = self.refusal_; refusal != SQLITE_OK) {
      ++self.refused_writes_;
      return refusal;
    }
    const sqlite3_io_methods* base = nullptr;
    std::memcpy(&base, BaseMethodsSlot(file), sizeof(base));
    return base->xWrite(file, data, amount, offset);
  }
  static char* BaseMethodsSlot(sqlite3_file* file) {
    return reinterpret_cast<char*>(file) + current_->base_->szOsFile;
  }
  // The base's methods with Write in place of xWrite, one copy per methods table the base uses.
  const sqlite3_io_methods* MethodsFor(const sqlite3_io_methods* base) {
    std::lock_guard lock(mutex_);
    std::unique_ptr<sqlite3_io_methods>& methods = methods_[base];
    if (methods == nullptr) {
      methods = std::make_unique<sqlite3_io_methods>(*base);
      methods->xWrite = &Write;
    }
    return methods.get();
  }

  static inline RefusingVfs* current_ = nullptr;
  sqlite3_vfs* const base_;
  sqlite3_vfs vfs_{};
  std::atomic<int> refusal_{SQLITE_OK};
  std::atomic<int> refused_writes_{0};
  std::mutex mutex_;
  std::map<const sqlite3_io_methods*, std::unique_ptr<sqlite3_io_methods>> methods_;
};

}  // namespace llmctl::store::test_support

#endif  // LLMCTL_CONTROLLER_STORE_REFUSING_VFS_H_
