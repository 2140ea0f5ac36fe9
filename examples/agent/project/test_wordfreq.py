"""Unit tests of wordfreq (run with ``python3 -m unittest`` in this directory)."""

import unittest

from wordfreq import top_words, words


class WordsTest(unittest.TestCase):
    def test_lower_cased_without_punctuation(self) -> None:
        self.assertEqual(words("The cat, the hat."), ["the", "cat", "the", "hat"])


class TopWordsTest(unittest.TestCase):
    def test_most_frequent_first(self) -> None:
        self.assertEqual(top_words("the cat and the hat", 1), [("the", 2)])


if __name__ == "__main__":
    unittest.main()
