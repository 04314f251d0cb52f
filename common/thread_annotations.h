// Clang's thread-safety annotations: which mutex guards a field, which a function needs held or
// must not hold, and which functions take and give one back. `-Wthread-safety` (make
// thread-safety, a CI stage) checks them at compile time; other compilers see nothing.
//
// Prefixed LLMCTL_ because gRPC's headers bring in Abseil's legacy unprefixed GUARDED_BY.
#ifndef LLMCTL_COMMON_THREAD_ANNOTATIONS_H_
#define LLMCTL_COMMON_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define LLMCTL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LLMCTL_THREAD_ANNOTATION(x)
#endif

// A class that is a lock (Mutex), and one whose objects hold a lock for their lifetime
// (MutexLock).
#define LLMCTL_CAPABILITY(name) LLMCTL_THREAD_ANNOTATION(capability(name))
#define LLMCTL_SCOPED_CAPABILITY LLMCTL_THREAD_ANNOTATION(scoped_lockable)

// A field read and written only with `mutex` held; a pointer whose pointee is.
#define LLMCTL_GUARDED_BY(mutex) LLMCTL_THREAD_ANNOTATION(guarded_by(mutex))
#define LLMCTL_PT_GUARDED_BY(mutex) LLMCTL_THREAD_ANNOTATION(pt_guarded_by(mutex))

// A function called only with these held (the `...Locked` functions), or only without them (it
// takes them itself).
#define LLMCTL_REQUIRES(...) LLMCTL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define LLMCTL_EXCLUDES(...) LLMCTL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// A function that takes a lock and returns with it held, or gives one back.
#define LLMCTL_ACQUIRE(...) LLMCTL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define LLMCTL_RELEASE(...) LLMCTL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

// A function that returns a reference to this lock.
#define LLMCTL_RETURN_CAPABILITY(mutex) LLMCTL_THREAD_ANNOTATION(lock_returned(mutex))

#endif  // LLMCTL_COMMON_THREAD_ANNOTATIONS_H_
