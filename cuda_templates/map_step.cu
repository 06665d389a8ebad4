    {
        const int64_t n_total = ${total};
        int64_t i0 = 0;
        if (vec & ${bit}) {
            // dense layout (checked by the launcher): four elements per 16-byte access, then a tail
            const int64_t n4 = n_total >> 2;
            for (int64_t q = gtid; q < n4; q += gstride) {
${vec_path}
            }
            i0 = n4 << 2;
        }
        for (int64_t i = i0 + gtid; i < n_total; i += gstride) {
${delin}
${body}
        }
    }
