"""Solution of exercise ssp-hold."""


def may_pull(my_clock, clocks, s):
    return my_clock - min(clocks) <= s
