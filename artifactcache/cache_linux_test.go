package artifactcache

import "syscall"

func syscallENOSPC() error { return syscall.ENOSPC }
