/*
 * lm_check.h - check.h's status assertions for the decoder's tests: lm
 * reports through kve_last_error and kvevict through kve_last_error, so a
 * failed call shows both messages. Include after check.h.
 */
#ifndef KVE_LM_CHECK_H
#define KVE_LM_CHECK_H

#include "check.h"
#include "lm.h"

#undef ASSERT_OK
#undef ASSERT_STATUS
#define ASSERT_OK(call) ASSERT_STATUS(call, KVE_OK)
#define ASSERT_STATUS(call, want)                                                                  \
    do {                                                                                           \
        kve_status st_ = (call);                                                                   \
        if (st_ != (want))                                                                         \
            CHECK_FAIL_AT("%s -> %s, want %s (lm: %s; kvevict: %s)", #call, kve_status_name(st_),  \
                          kve_status_name(want), kve_last_error(), kve_last_error());               \
    } while (0)

#endif /* KVE_LM_CHECK_H */
