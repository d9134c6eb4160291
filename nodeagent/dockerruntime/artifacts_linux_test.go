package dockerruntime

import "syscall"

func syscallENOSPC() error { return syscall.ENOSPC }
