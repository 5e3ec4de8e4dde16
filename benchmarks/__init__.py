"""Traffic profiles, request generation and capacity planning for load tests (``sts plan``)."""
