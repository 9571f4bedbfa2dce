#include "check.h"
#include "kvevict.h"

static void test_h2o_basic(void)
{
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=4,recent_window=1", NULL, &p));
    ASSERT_STR_EQ(kve_policy_spec(p), "h2o:budget=4,recent_window=1");
    float attn[8];
    int32_t victims[8];
    size_t nv = 0;
    for (int32_t t = 0; t < 8; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            attn[i] = i == 0 ? 0.9f : 0.1f / (float)n;
        ASSERT_OK(kve_policy_step(p, t, attn, n));
        ASSERT_OK(kve_policy_evict(p, 4, victims, 8, &nv));
    }
    ASSERT_EQ(kve_policy_size(p), 4);
    ASSERT_EQ(kve_policy_positions(p)[0], 0);
    ASSERT_EQ(kve_policy_positions(p)[3], 7);
    ASSERT_EQ(kve_policy_state_bytes(p), 13 * 5);
    kve_policy_free(p);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_h2o_basic);
    return CHECK_DONE();
}
