import unittest

from minicalc.ops import add, divide, mean


class TestOps(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_divide(self):
        self.assertEqual(divide(6, 3), 2)

    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)
